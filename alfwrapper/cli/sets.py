"""Named sets on the command line: ``alfwrapper set`` (create, add, del, list, flush,
destroy) and ``alfwrapper crowdsec`` (a bouncer keeping a set equal to CrowdSec's bans)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from alfwrapper.cli.parser import Parser, examples
from alfwrapper.errors import EX_USAGE, AlfError

_SET_VERBS = {
    "create": "make the set NAME, empty, or holding FILE's CIDRs (one a line, # comments; "
    "by default /etc/alfwrapper/sets/NAME.list if there is one); nothing if it exists",
    "add": "put CIDRs in it, for every service that names it, from the next packet on",
    "del": "take CIDRs out of it",
    "list": "print its entries (without NAME: the sets)",
    "flush": "empty it",
    "destroy": "remove it (services that hold it keep it until their next start or "
    "reload; early drop ends at once)",
    "early": "drop what the set's sockets would drop at XDP on the interfaces IFACE... "
    "already, before the stack (none: nowhere); root only",
}


def set_parser() -> Parser:
    p = Parser(
        prog="alfwrapper set",
        usage="alfwrapper set {create,add,del,list,flush,destroy,early} [NAME] "
        "[CIDR...|IFACE...] [--timeout SECONDS] [--early IFACE...]",
        description="Named sets: the host's lists of prefixes that services name in "
        "allow-set and deny-set, changed while they run.  "
        + "; ".join(f"{verb}: {text}" for verb, text in _SET_VERBS.items())
        + ".",
        epilog=examples(
            "alfwrapper set create blocklist",
            "alfwrapper set add blocklist 198.51.100.7 2001:db8:bad::/48 --timeout 3600",
            "alfwrapper set del blocklist 198.51.100.7",
            "alfwrapper set list blocklist",
            "alfwrapper set early blocklist eth0",
        ),
    )
    p.add_argument("verb", choices=list(_SET_VERBS), help="what to do")
    p.add_argument("name", nargs="?", default="", metavar="NAME", help="the set's name")
    p.add_argument("cidrs", nargs="*", metavar="CIDR", help="addresses or subnets (create: FILE)")
    p.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="add: the entries lapse after this long (default: never)",
    )
    p.add_argument(
        "--early",
        nargs="+",
        default=[],
        metavar="IFACE",
        help="create: drop early on these interfaces too (as set early does)",
    )
    p.add_argument(
        "--size",
        type=int,
        default=0,
        metavar="N",
        help="create: the entries each of its maps holds (default 65536)",
    )
    return p


def set_main(argv: Sequence[str]) -> int:  # noqa: C901
    from alfwrapper import sets  # noqa: PLC0415
    from alfwrapper.policy.prefixes import parse_cidrs  # noqa: PLC0415

    args = set_parser().parse_args(argv)
    verb, name = args.verb, args.name
    if not name:
        if verb != "list":
            raise AlfError(f"set {verb}", "no set named", f"alfwrapper set {verb} NAME", EX_USAGE)
        print("\n".join(sets.names()) or "alfwrapper: note: no sets", file=sys.stdout)
        return 0
    sets.check_name(name)
    wants_cidrs = verb in ("add", "del")
    if wants_cidrs and not args.cidrs:
        raise AlfError(f"set {verb} {name}", "no CIDR given", "give one or more", EX_USAGE)
    if args.early and verb != "create":
        raise AlfError(
            "--early", "is for set create", f"alfwrapper set early {name} IFACE...", EX_USAGE
        )
    if not wants_cidrs and args.cidrs and verb not in ("create", "early"):
        raise AlfError(
            f"set {verb} {name}", "takes no CIDR", f"alfwrapper set {verb} NAME", EX_USAGE
        )
    if args.timeout and verb != "add" or not (args.timeout == 0 or 0.001 <= args.timeout <= 1e8):
        raise AlfError(
            "--timeout",
            "is for set add, 0.001 to 100000000 seconds",
            "give it to set add",
            EX_USAGE,
        )
    if verb == "create":
        if len(args.cidrs) > 1:
            raise AlfError(f"set create {name}", "takes one FILE", "give one list file", EX_USAGE)
        default = sets.list_file(name)
        path = args.cidrs[0] if args.cidrs else str(default) if default.exists() else ""
        made = sets.create(
            name, sets.read_list(path) if path else (), args.size or sets.DEFAULT_SIZE
        )
        print(
            f"set {name}: {'created' if made else 'exists already'}"
            + (f" from {path}" if made and path else "")
        )
        if args.early:
            _early(name, args.early)
    elif verb == "add":
        prefixes = parse_cidrs(args.cidrs)
        sets.add(name, prefixes, args.timeout)
        lapse = f", lapsing in {args.timeout:g} s" if args.timeout else ""
        print(f"set {name}: {len(prefixes)} added{lapse}", flush=True)
        from alfwrapper.lifecycle import cut  # noqa: PLC0415  (after the ban: set add alone)

        report = cut.cut_for_set(name, prefixes)
        print("\n".join(report.done), end="\n" if report.done else "")
        cut.say_problems(report)
    elif verb == "del":
        gone = sets.delete(name, parse_cidrs(args.cidrs))
        print(f"set {name}: {gone} removed")
    elif verb == "list":
        now = sets.now_ns()
        for prefix, expiry in sets.entries(name):
            left = f"\tlapses in {max(0, expiry - now) / 1e9:.1f} s" if expiry else ""
            print(f"{prefix}{left}")
    elif verb == "flush":
        print(f"set {name}: {sets.flush(name)} removed")
    elif verb == "early":
        _early(name, args.cidrs)
    elif not sets.destroy(name):
        raise AlfError(f"set {name}", "does not exist", "alfwrapper set list", EX_USAGE)
    else:
        from alfwrapper.sets import early  # noqa: PLC0415

        for line in early.forget(name):
            print(line)
        print(f"set {name}: destroyed")
    return 0


def _early(name: str, interfaces: Sequence[str]) -> None:
    from alfwrapper.sets import early  # noqa: PLC0415

    done = early.set_early(name, interfaces)
    for line in done:
        print(line)
    if not done:
        where = ", ".join(interfaces) or "no interface"
        print(f"set {name}: early drop on {where} already")


def crowdsec_parser() -> Parser:
    p = Parser(
        prog="alfwrapper crowdsec",
        description="A CrowdSec bouncer: keep a named set equal to the bans (scopes Ip and "
        "Range) of a CrowdSec Local API, polled, for every service that names the set "
        "(run by alfwrapper-crowdsec.service).",
        epilog=examples(
            "alfwrapper crowdsec    # /etc/alfwrapper/crowdsec.toml",
            "alfwrapper crowdsec --config /etc/alfwrapper/crowdsec-fleet.toml",
        ),
    )
    p.add_argument(
        "--config",
        default="/etc/alfwrapper/crowdsec.toml",
        metavar="FILE",
        help="the bouncer's TOML file (the default: this one)",
    )
    p.add_argument(
        "--key-file",
        default="",
        metavar="FILE",
        help="read the API key from FILE, not the config's api-key-file (the "
        "unit's: its credential)",
    )
    p.add_argument(
        "--sets",
        default="",
        metavar="DIR",
        help="where the sets' tree is seen (the unit binds it there)",
    )
    p.add_argument(
        "--once", action="store_true", help="one full resync, then exit: 0, or its error's code"
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help="make the config's set if it does not exist, and exit (the unit's "
        "ExecStartPre=, as root)",
    )
    return p


def crowdsec_main(argv: Sequence[str]) -> int:
    from pathlib import Path  # noqa: PLC0415

    from alfwrapper import sets  # noqa: PLC0415
    from alfwrapper.lifecycle import bouncer  # noqa: PLC0415

    args = crowdsec_parser().parse_args(argv)
    if args.sets:
        sets.use_root(Path(args.sets))
    config = bouncer.read_config(args.config, args.key_file, need_key=not args.prepare)
    if args.prepare:
        made = sets.create(config.set)
        print(f"set {config.set}: {'created' if made else 'exists already'}")
        return 0
    return bouncer.run(config, once=args.once)
