"""The subcommands that change a running service, through lifecycle/service.py (on the
pinned state here, or on this user's through the loader): reload, deny, allow, revoke,
show and gc."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from alfwrapper.cli.options import add_rule_options
from alfwrapper.cli.parser import Parser, examples
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.host.progress import seconds_running
from alfwrapper.policy.rules import check_service


def reload_parser() -> Parser:
    p = Parser(
        prog="alfwrapper reload",
        usage="alfwrapper reload [SERVICE] [--policy NAME|PATH] [RULE OPTIONS]",
        description="Compile the service's policy anew and put it in force on every socket "
        "of the running service; the application keeps running.  With no rule options, "
        "the options it was started (or last reloaded) with are read again, policy files "
        "included.  Runtime allow/deny rules end.",
        epilog=examples(
            "alfwrapper reload web",
            "alfwrapper reload web --policy web --deny 203.0.113.0/24",
            "ExecReload=/usr/bin/alfwrapper reload    # in a unit: its own service",
        ),
    )
    p.add_argument("service", nargs="?", default="", help="default: the systemd unit we run in")
    add_rule_options(p)
    return p


def reload_main(argv: Sequence[str]) -> int:
    p = reload_parser()
    if "-h" in argv or "--help" in argv:
        p.parse_args(["--help"])
    given = argv[0] if argv and not argv[0].startswith("-") else ""
    options = list(argv[1:] if given else argv)
    service = default_service(given)
    ops = _service_ops()
    found = ops.reload(service, options or None, parse_policy)
    guarded = [m.title() + (f": {m.meta['guards']}" if m.meta.get("guards") else "") for m in found]
    kept = ops.runtime_rule_count(found)
    print(
        f"reloaded {service} after {seconds_running():.1f} s: {len(found)} socket(s), "
        + "; ".join(guarded)
        + f"; kept {kept} runtime rule(s)"
    )
    return 0


def _service_ops() -> Any:
    """The commands that change running services: on the pinned state here, or, without
    the privilege for it, on this user's through the loader."""
    from alfwrapper.lifecycle import service  # noqa: PLC0415
    from alfwrapper.loader import client  # noqa: PLC0415

    client.use_if_needed()
    return service


def default_service(given: str) -> str:
    return str(_service_ops().default_service(given))


CHANGES = {
    "deny": "Drop packets from these subnets on a running service, from the next packet "
    "on, until revoked: the rule stays through reloads and restarts.",
    "allow": "Pass packets from these subnets on a running service (a runtime rule decides "
    "before the policy's subnet rules), until revoked: the rule stays through reloads and "
    "restarts.",
    "revoke": "Remove runtime rules made by allow or deny (--all: every one).",
}


def change_parser(verb: str) -> Callable[[], Parser]:
    def parser() -> Parser:
        every = verb == "revoke"
        p = Parser(
            prog=f"alfwrapper {verb}",
            usage=f"alfwrapper {verb} SERVICE [--socket NAME] "
            + ("{CIDR... | --all}" if every else "CIDR..."),
            description=CHANGES[verb],
            epilog=examples(
                f"alfwrapper {verb} web 198.51.100.7 2001:db8::/48",
                f"alfwrapper {verb} web --socket admin 203.0.113.0/24",
                *([f"alfwrapper {verb} web --all"] if every else []),
            ),
        )
        p.add_argument("service", help="the service's name (as in alfwrapper status)")
        p.add_argument(
            "cidrs", nargs="*" if every else "+", metavar="CIDR", help="addresses or subnets"
        )
        p.add_argument("--socket", default="", metavar="NAME", help="only the sockets so named")
        if every:
            p.add_argument("--all", action="store_true", help="every runtime rule")
        return p

    return parser


def change_main(verb: str) -> Callable[[Sequence[str]], int]:
    def run(argv: Sequence[str]) -> int:
        p = change_parser(verb)()
        args = p.parse_args(argv)
        every = bool(getattr(args, "all", False))
        if every == bool(args.cidrs):
            p.error("give CIDRs or --all, not both" if every else "give CIDRs or --all")
        ops = _service_ops()
        service = check_service(args.service)
        return int(ops.out(ops.change(service, args.socket, verb, args.cidrs, every)))

    return run


def show_parser() -> Parser:
    p = Parser(
        prog="alfwrapper show",
        usage="alfwrapper show SERVICE",
        description="List a running service's sockets and their runtime allow/deny rules.",
        epilog=examples("alfwrapper show web"),
    )
    p.add_argument("service", help="the service's name (as in alfwrapper status)")
    return p


def show_main(argv: Sequence[str]) -> int:
    args = show_parser().parse_args(argv)
    ops = _service_ops()
    return int(ops.out(ops.show(check_service(args.service))))


def gc_parser() -> Parser:
    return Parser(
        prog="alfwrapper gc",
        usage="alfwrapper gc",
        description="Remove the pinned state of sockets that no longer exist (every start "
        "of a wrapper does this for its own network namespace), and the early drop of "
        "interfaces that are gone.",
        epilog=examples("alfwrapper gc"),
    )


def gc_main(argv: Sequence[str]) -> int:
    gc_parser().parse_args(argv)
    ops = _service_ops()
    return int(ops.out(ops.gc()))
