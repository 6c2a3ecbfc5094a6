"""Command line: ``alfwrapper [OPTIONS] -- COMMAND`` and the subcommands check, explain,
doctor and knock.  Argument parsing and ``main`` only.

``main`` is the only place that turns errors into a message and an exit code.
Every subcommand that takes rules builds its Policy the same way
(``policy_from_args``), from --policy files and rule options alike.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from alfwrapper import __version__
from alfwrapper.errors import (
    EX_CONFIG,
    EX_PIPE_CLOSED,
    EX_UNAVAILABLE,
    EX_USAGE,
    AlfError,
    excerpt,
    internal,
    missing_library,
    report,
)
from alfwrapper.host import activation, capabilities
from alfwrapper.host.progress import seconds_running
from alfwrapper.lifecycle import wrapper
from alfwrapper.policy.files import (
    KEYS,
    Entry,
    Policy,
    accepted,
    build_policy,
    cli_entry,
    read_policy,
    split_scope,
)
from alfwrapper.policy.rules import (
    SOCKET_NAME_RULE,
    ListenSpec,
    check_service,
    parse_listen,
    parse_ports,
    service_name,
    valid_socket_name,
)
from alfwrapper.record import Record

USAGE = """\
alfwrapper [--policy NAME|PATH] [RULE OPTIONS] [--listen ADDR:PORT [--name NAME]] -- COMMAND...
       alfwrapper SUBCOMMAND ...    (the subcommands are listed below; each has --help)"""


class _Formatter(argparse.HelpFormatter):
    """argparse's, but an "examples:" epilog keeps its lines, and the width is found
    without shutil: argparse makes a formatter for every option it is given, help or
    not, and importing shutil (with bz2 and lzma) would cost every start, a denied
    Accept=yes peer's too, about 3 ms.  The same width shutil.get_terminal_size
    gives: $COLUMNS, else the terminal's, else 80."""

    def __init__(self, prog: str) -> None:
        try:
            width = int(os.environ.get("COLUMNS", "0"))
        except ValueError:
            width = 0
        if width <= 0:
            try:
                width = os.get_terminal_size(1).columns
            except OSError:
                width = 80
        super().__init__(prog, width=width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return text
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise AlfError("usage", message, f"see {self.prog} --help or man alfwrapper", EX_USAGE)


def examples(*lines: str) -> str:
    """An epilog of example command lines, each with what it does after a '#'."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class _ListenAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = "stream" if option_string == "--listen" else "datagram"
        namespace.listens = [*namespace.listens, parse_listen(kind, str(values))]


class _NameAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name = str(values)
        if not namespace.listens:
            raise AlfError(
                "--name",
                f"{excerpt(name)} follows no --listen or --listen-datagram",
                "put --name NAME right after the socket it names",
                EX_USAGE,
            )
        if not valid_socket_name(name):
            raise AlfError(
                "--name", f"{excerpt(name)} is not a valid socket name", SOCKET_NAME_RULE, EX_USAGE
            )
        last = namespace.listens[-1]
        if last.name != activation.DEFAULT_NAME:
            raise AlfError(
                "--name",
                f"{last} is already named {excerpt(last.name)}",
                "give one --name per socket",
                EX_USAGE,
            )
        namespace.listens = [
            *namespace.listens[:-1],
            ListenSpec(last.kind, last.host, last.port, name),
        ]


_METAVARS = {
    "allow": "CIDR",
    "deny": "CIDR",
    "allow-file": "FILE",
    "deny-file": "FILE",
    "allow-set": "SET",
    "deny-set": "SET",
    "interface": "IFNAME",
    "knock": "PORT,PORT,...",
    "knock-secret": "FILE",
    "knock-spa-port": "PORT",
    "knock-spa-key": "FILE",
    "filter": "FILE.c",
}


def add_socket_options(parser: argparse.ArgumentParser) -> None:
    s = parser.add_argument_group("sockets to create (besides those inherited per sd_listen_fds)")
    s.add_argument(
        "--listen",
        action=_ListenAction,
        metavar="[ADDR]:PORT",
        dest="listens",
        default=[],
        help="create a TCP listener; [::]:PORT is dual-stack",
    )
    s.add_argument(
        "--listen-datagram",
        action=_ListenAction,
        metavar="[ADDR]:PORT",
        dest="listens",
        help="create a UDP socket",
    )
    s.add_argument(
        "--name",
        action=_NameAction,
        metavar="NAME",
        help="name the socket created by the previous --listen* (LISTEN_FDNAMES)",
    )


def add_rule_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The rule options, one per policy key, shared by every subcommand that takes rules."""
    parser.add_argument(
        "--policy",
        metavar="NAME|PATH",
        help="read rules (and sockets to create) from a policy file; NAME is looked up in "
        "/etc/alfwrapper/policy, /usr/local/lib/alfwrapper/policy, /usr/lib/alfwrapper/policy",
    )
    r = parser.add_argument_group(
        "rules ([NAME=]VALUE applies to the sockets named NAME only; a packet must pass "
        "every kind given)"
    )
    for key, spec in KEYS.items():
        if key in skip:
            parser.set_defaults(**{key.replace("-", "_"): []})
        elif key == "set":
            r.add_argument(
                "--set",
                action="append",
                default=[],
                nargs=3,
                metavar=("[NAME=]MAP", "KEY", "VALUE"),
                help=spec.help,
            )
        elif spec.kind == "switch":  # the bare option, or [NAME=]yes|no
            r.add_argument(f"--{key}", action="append", default=[], nargs="?", const="yes",
                           metavar="[NAME=]yes|no", help=spec.help)  # fmt: skip
        else:
            metavar = _METAVARS.get(key, "SECONDS" if spec.number is float else "N")
            r.add_argument(f"--{key}", action="append", default=[], metavar=metavar, help=spec.help)


def policy_from_args(
    args: argparse.Namespace, command: Sequence[str], environ: Mapping[str, str]
) -> Policy:
    """The Policy of a command line: its --policy file (and drop-ins), then its rule options."""
    entries: list[Entry] = []
    listens: list[ListenSpec] = []
    files: list[str] = []
    if args.policy:
        entries, listens, files = read_policy(args.policy, environ)
    layer = len(files)
    for key in KEYS:
        if key == "set":
            for map_name, map_key, value in args.set:
                scope, name = split_scope(map_name)
                entries.append(Entry("set", scope, (name, map_key, value), "--set", layer))
        else:
            entries += [
                cli_entry(key, text, layer) for text in getattr(args, key.replace("-", "_"))
            ]
    return build_policy(entries, [*listens, *args.listens], command, files)


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options, and COMMAND: everything after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        return argv[:split], argv[split + 1 :]
    return argv, []


def wrapper_parser() -> Parser:
    p = Parser(
        prog="alfwrapper",
        usage=USAGE,
        description="Attach eBPF filters to a service's sockets, then exec the service "
        "with them (sd_listen_fds).",
        epilog=examples(
            "alfwrapper --listen [::]:8080 --allow 192.0.2.0/24 -- ./my-service",
            "alfwrapper --policy web -- /usr/bin/web    # rules from a policy file",
            "alfwrapper --deny-file blocklist -- ./my-service    # inherited sockets",
        )
        + "\n\nsubcommands (alfwrapper SUBCOMMAND --help):\n  "
        + ", ".join(SUBCOMMANDS),
    )
    p.add_argument("--version", action="version", version=f"alfwrapper {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="on errors, show details: compiler output, verifier log",
    )
    p.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help="the name its pinned state is kept under (default: the systemd unit, else "
        "the command's name)",
    )
    p.add_argument(
        "--no-capabilities",
        action="store_true",
        help="start COMMAND with no capability at all (default: it keeps what its unit "
        f"gives, but {', '.join(name for name, _ in capabilities.REACHES_FILTER.values())})",
    )
    add_socket_options(p)
    add_rule_options(p)
    return p


def parse_policy(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Policy:
    """The Policy of a wrapper command line (``[OPTIONS] [-- COMMAND...]``)."""
    options, command = _split_command(argv)
    args = wrapper_parser().parse_args(options)
    return policy_from_args(args, command, os.environ if environ is None else environ)


def wrapper_main(argv: Sequence[str]) -> int:
    diverted = activation.divert_inetd_streams()  # before any output: it could reach a peer
    options, command = _split_command(argv)
    if "--print-filter" in options:
        raise AlfError(
            "--print-filter",
            "is an option of `alfwrapper check` now",
            "run alfwrapper check --print-filter [RULE OPTIONS]",
            EX_USAGE,
        )
    args = wrapper_parser().parse_args(options)
    policy = policy_from_args(args, command, os.environ)
    service = service_name(args.service, activation.unit_of_this_process(), policy.command)
    return wrapper.run(
        policy, service, options, keep_capabilities=not args.no_capabilities, diverted=diverted
    )


def check_parser() -> Parser:
    from alfwrapper.observe import check  # noqa: PLC0415

    p = Parser(
        prog="alfwrapper check",
        description=check.__doc__,
        epilog=examples(
            "alfwrapper check --policy web --strict",
            "alfwrapper check --allow-file office.rules --names web,admin --json",
            "alfwrapper check --filter mine.c --print-filter",
        ),
    )
    add_socket_options(p)
    add_rule_options(p)
    p.add_argument(
        "--names",
        metavar="NAME,...",
        default="",
        help="the names of the sockets a socket unit will pass (FileDescriptorName=)",
    )
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--print-filter", action="store_true", help="also print each program's C as compiled"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="on errors, show details")
    return p


def check_main(argv: Sequence[str]) -> int:
    from alfwrapper.observe import check  # noqa: PLC0415

    args = check_parser().parse_args(argv)
    policy = policy_from_args(args, (), os.environ)
    names = [n for n in args.names.split(",") if n]
    return check.main(policy, names, args.strict, args.json, args.print_filter)


def explain_parser() -> Parser:
    from alfwrapper.observe import explain  # noqa: PLC0415

    p = Parser(
        prog="alfwrapper explain",
        description=explain.__doc__ + "  --interface is the interface the packet arrives "
        "on; interface rules come from --policy here.",
        epilog=examples(
            "alfwrapper explain --policy web --from 198.51.100.7",
            "alfwrapper explain --allow 192.0.2.0/24 --from 192.0.2.9 --from 2001:db8::1",
            "alfwrapper explain --policy web --socket admin --from 192.0.2.9 --json",
            "alfwrapper explain --policy web --socket web --from 203.0.113.7 --spa-datagram HEX",
            "alfwrapper explain web --from 2001:db8:a::1",
            "alfwrapper explain web --port 443 --from 198.51.100.7 --json",
        ),
    )
    p.add_argument(
        "service",
        nargs="?",
        default="",
        metavar="SERVICE",
        help="a running service: the verdict of the program in force on its socket, with "
        "its runtime rules, named sets and knock state (as root); without it, the verdict "
        "of the rules given here",
    )
    add_socket_options(p)
    add_rule_options(p, skip=("interface",))
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        metavar="ADDR",
        help="the packet's source address (repeatable: one verdict per line, in order)",
    )
    p.add_argument("--socket", default="", metavar="NAME", help="the socket's name")
    p.add_argument(
        "--interface",
        dest="ingress",
        default="",
        metavar="IFNAME",
        help="the interface the packet arrives on",
    )
    p.add_argument(
        "--protocol", choices=("tcp", "udp"), default="", help="default: the socket's, else tcp"
    )
    p.add_argument("--port", type=int, default=0, help="destination port (default: the socket's)")
    p.add_argument("--source-port", type=int, default=40000, help="default 40000")
    p.add_argument("--spa-datagram", metavar="HEX",
                   help="with --knock-spa: the verdict of the socket's SPA socket on this "
                   "datagram (hexadecimal), sent from --from")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="on errors, show details")
    return p


def explain_main(argv: Sequence[str]) -> int:
    from alfwrapper.observe import explain  # noqa: PLC0415

    args = explain_parser().parse_args(argv)
    if args.service:
        given = ["--policy"] if args.policy else []
        given += [f"--{k}" for k in KEYS if getattr(args, k.replace("-", "_"), None)]
        if given or args.listens:
            raise AlfError(
                f"explain {args.service}",
                f"{(given or ['--listen'])[0]} is for explaining rules, not a running service",
                "give either SERVICE or rule options (--policy ...)",
                EX_USAGE,
            )

        return explain.main_service(check_service(args.service), args, parse_policy)
    policy = policy_from_args(args, (), os.environ)
    return explain.main(policy, args)


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
    guarded = [m.title() + (f": {m.meta['guards']}" if m.meta.get("guards") else "")
               for m in found]  # fmt: skip
    kept = ops.runtime_rule_count(found)
    print(f"reloaded {service} after {seconds_running():.1f} s: {len(found)} socket(s), "
          + "; ".join(guarded) + f"; kept {kept} runtime rule(s)")  # fmt: skip
    return 0


def _service_ops() -> Any:
    """The commands that change running services: on the pinned state here, or, without
    the privilege for it, on this user's through the loader."""
    from alfwrapper.lifecycle import service  # noqa: PLC0415
    from alfwrapper.loader import client  # noqa: PLC0415

    client.use_if_needed()
    return service


def _observe_ops() -> Any:
    """The commands that read running services (status, metrics, the drop log), the
    same two ways."""
    from alfwrapper.loader import client  # noqa: PLC0415
    from alfwrapper.observe import status as observe  # noqa: PLC0415

    client.use_if_needed()
    return observe


def default_service(given: str) -> str:
    return str(_service_ops().default_service(given))


_CHANGES = {
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
            description=_CHANGES[verb],
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


def status_parser() -> Parser:
    p = Parser(
        prog="alfwrapper status",
        usage="alfwrapper status [SERVICE] [--json | --prometheus [--output FILE]]",
        description="What each service's firewall does: its sockets, whether the application "
        "runs, its rules and runtime rules, the program in force, and the packets passed and "
        "dropped by reason since the socket's first start.  Reads the pinned state: no "
        "wrapper need be running.",
        epilog=examples(
            "alfwrapper status",
            "alfwrapper status web --json",
            "alfwrapper status --prometheus --output "
            "/var/lib/prometheus/node-exporter/alfwrapper.prom",
        ),
    )
    p.add_argument("service", nargs="?", default="", help="default: every service")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true", help="print JSON")
    how.add_argument("--prometheus", action="store_true",
                     help="print the counters in Prometheus' text format")  # fmt: skip
    p.add_argument("--output", metavar="FILE", default="",
                   help="write to FILE instead, atomically (for node_exporter)")  # fmt: skip
    return p


def status_main(argv: Sequence[str]) -> int:
    args = status_parser().parse_args(argv)
    ops = _observe_ops()
    report = ops.status(check_service(args.service) if args.service else "")
    if args.json:
        import json  # noqa: PLC0415  (not for a start)

        text = json.dumps(report, indent=2) + "\n"
    elif args.prometheus:
        text = ops.prometheus(report)
    else:
        text = "\n".join(ops.status_lines(report)) + "\n"
    if args.output:
        ops.write_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def log_parser() -> Parser:
    p = Parser(
        prog="alfwrapper log",
        usage="alfwrapper log [SERVICE] [--follow] [--json]",
        description="Print the packets a service's firewall dropped, one line each, with the "
        "source and the reason, from its drop log (--log-drops).  Without --follow, what is "
        "buffered, then exit.  Reading takes the events: a journal forwarder, when one runs, "
        "sends them to the journal instead.",
        epilog=examples("alfwrapper log web", "alfwrapper log web --follow --json"),
    )
    p.add_argument("service", nargs="?", default="", help="default: every service")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    return p


def log_main(argv: Sequence[str]) -> int:
    args = log_parser().parse_args(argv)
    service = check_service(args.service) if args.service else ""
    return int(_observe_ops().log(service, args.follow, args.json))


def gc_parser() -> Parser:
    return Parser(
        prog="alfwrapper gc",
        usage="alfwrapper gc",
        description="Remove the pinned state of sockets that no longer exist (every start "
        "of a wrapper does this for its own network namespace).",
        epilog=examples("alfwrapper gc"),
    )


def gc_main(argv: Sequence[str]) -> int:
    gc_parser().parse_args(argv)
    ops = _service_ops()
    return int(ops.out(ops.gc()))


def doctor_parser() -> Parser:
    p = Parser(
        prog="alfwrapper doctor",
        usage="alfwrapper doctor [--inetd] [--no-capabilities] [--for COMMAND [ARG...]]",
        description="Check that this machine can run alfwrapper: the kernel's features, BPF "
        "permissions, kernel headers for BCC, the Python modules it needs, and a filter "
        "built, loaded and run; one line per check, each problem with what to do.  With "
        "--for: whether COMMAND is likely to work behind alfwrapper instead.",
        epilog=examples(
            "alfwrapper doctor",
            "sudo -u someone alfwrapper doctor    # as a user",
            "alfwrapper doctor --inetd --for /usr/sbin/sshd -i",
        ),
    )
    p.add_argument(
        "--for",
        dest="command",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="how COMMAND takes its sockets, and whether it needs a capability alfwrapper "
        "removes (the rest of the line is COMMAND and its arguments)",
    )
    p.add_argument(
        "--inetd",
        action="store_true",
        help="with --for: COMMAND is started inetd style (StandardInput=socket), not with "
        "LISTEN_FDS",
    )
    p.add_argument(
        "--no-capabilities",
        action="store_true",
        help="with --for: COMMAND is started with --no-capabilities",
    )
    return p


def doctor_main(argv: Sequence[str]) -> int:
    args = doctor_parser().parse_args(argv)
    if args.command is None:
        if args.inetd or args.no_capabilities:
            raise AlfError(
                "doctor", "--inetd and --no-capabilities go with --for", "add --for COMMAND",
                EX_USAGE,
            )  # fmt: skip
        from alfwrapper.observe import doctor  # noqa: PLC0415

        return doctor.main()
    if not args.command:
        raise AlfError("doctor --for", "no COMMAND given", "add the command and its "
                       "arguments after --for", EX_USAGE)  # fmt: skip
    from alfwrapper.observe import daemons  # noqa: PLC0415

    findings = daemons.examine(args.command, args.inetd, args.no_capabilities)
    for finding in findings:
        print(f"{'ok' if finding.ok else 'problem'}: {finding.text}")
    return 0 if all(f.ok for f in findings) else EX_CONFIG


def knock_parser() -> Parser:
    p = Parser(
        prog="alfwrapper knock",
        usage="alfwrapper knock HOST PORT (--sequence P,P,P | --secret FILE) [--udp]\n"
        "       alfwrapper knock HOST PORT --spa --secret FILE [--address A|sender] "
        "[--spa-port PORT] [--wait S]",
        description="Knock on a service's port: one connection attempt (SYN) from each "
        "source port of the sequence, in order, each abandoned once sent; or, with --spa, "
        "one single-packet authorization datagram to its SPA socket, which works behind "
        "NAT, and then whether the service answers.",
        epilog=examples(
            "alfwrapper knock 192.0.2.1 8080 --spa --secret knock.secret --address 203.0.113.7",
            "alfwrapper knock 192.0.2.1 8080 --sequence 7001,7002,7003",
            "alfwrapper knock 2001:db8::1 8080 --secret knock.secret",
            "alfwrapper knock 192.0.2.1 5353 --sequence 7001,7002 --udp",
        ),
    )
    p.add_argument("host", help="the service's address")
    p.add_argument("port", type=int, help="the service's port")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sequence", metavar="P,P,P",
                       help="the source ports, in order (the service's --knock)")  # fmt: skip
    which.add_argument("--secret", metavar="FILE",
                       help="derive the current sequence from this secret "
                       "(the service's --knock-secret)")  # fmt: skip
    p.add_argument("--steps", type=int, default=3, help="secret sequences' length (default 3)")
    p.add_argument("--window", type=int, default=30, help="secret window seconds (default 30)")
    p.add_argument("--udp", action="store_true", help="knock with UDP datagrams")
    p.add_argument("--spa", action="store_true",
                   help="single-packet authorization, keyed with --secret (the service's "
                   "--knock-secret, or your own --knock-spa-key) (the service's "
                   "--knock-spa)")  # fmt: skip
    p.add_argument("--address", metavar="A|sender",
                   help="with --spa: the address to open, your public one behind a NAT "
                   "(default: the one this host sends from); sender: the one the datagram "
                   "comes from, where the service allows it (--knock-spa-sender)")  # fmt: skip
    p.add_argument("--spa-port", type=int, metavar="PORT",
                   help="with --spa: the SPA socket's UDP port (the service's "
                   "--knock-spa-port; default PORT)")  # fmt: skip
    p.add_argument("--wait", type=float, default=3.0, metavar="SECONDS",
                   help="with --spa: how long to wait for the service to answer (default 3; "
                   "0: do not try)")  # fmt: skip
    return p


def knock_main(argv: Sequence[str]) -> int:
    from alfwrapper.policy import knocking  # noqa: PLC0415

    args = knock_parser().parse_args(argv)
    if not 0 < args.port < 65536:
        raise AlfError(
            "knock", f"port {args.port} is out of range", "ports are 1 to 65535", EX_USAGE
        )
    if args.spa:
        return _knock_spa(args)
    if args.address or args.spa_port:
        raise AlfError("knock", "--address and --spa-port go with --spa", "add --spa", EX_USAGE)
    window, steps = accepted("knock-window"), accepted("knock-steps")
    if not window[0] <= args.window <= window[1] or not steps[0] <= args.steps <= steps[1]:
        raise AlfError(
            "knock",
            f"--window must be {window[0]:g} to {window[1]:g} and --steps {steps[0]:g} to "
            f"{steps[1]:g}",
            "use the server's --knock-window and --knock-steps",
            EX_USAGE,
        )
    if args.sequence:
        try:
            ports = parse_ports(args.sequence)
        except ValueError as err:
            raise AlfError(
                "--sequence", str(err), "give source ports in knock order", EX_USAGE
            ) from None
    else:
        secret = knocking.read_secret(args.secret)
        ports = knocking.secret_ports(secret, knocking.utc_window(args.window), args.steps)
    knocking.send_knocks(args.host, args.port, ports, udp=args.udp)
    print(f"knocked on {args.host} port {args.port} from ports {','.join(map(str, ports))}")
    print(
        "alfwrapper: note: if the connection now times out, a NAT that rewrites source ports "
        "(masquerade fully-random) may be between you and the service: knock from outside "
        "it (man alfwrapper: KNOCKING)",
        file=sys.stderr,
    )
    return 0


def _knock_spa(args: argparse.Namespace) -> int:
    """alfwrapper knock --spa: one datagram, then whether the service answers."""
    from alfwrapper.policy import knocking, spa  # noqa: PLC0415

    if not args.secret or args.sequence or args.udp:
        raise AlfError("knock --spa", "keys its datagram with --secret FILE alone",
                       "give --secret, without --sequence or --udp", EX_USAGE)  # fmt: skip
    spa_port = args.spa_port or args.port
    if not 0 < spa_port < 65536 or not 0 <= args.wait <= 60:
        raise AlfError("knock --spa", "--spa-port is 1 to 65535, --wait 0 to 60 seconds",
                       "use the service's --knock-spa-port", EX_USAGE)  # fmt: skip
    secret = knocking.read_secret(args.secret)
    if args.address is None:
        address: str | None = spa.local_address(args.host, spa_port)
    else:
        address = spa.check_address(args.address)
    spa.send(args.host, spa_port, spa.datagram(secret, spa_port, address))
    opened = "the address it comes from" if address is None else address
    print(f"sent an SPA datagram to {args.host} udp port {spa_port} opening {opened}")
    if not args.wait:
        return 0
    if spa.answers(args.host, args.port, args.wait):
        print(f"{args.host} port {args.port} answers")
        return 0
    raise AlfError(
        f"knock --spa {args.host} port {args.port}",
        f"no answer within {args.wait:g} s",
        "behind a NAT, give your public address (--address A); check the secret, the "
        "clock (the service allows its --knock-window of skew) and --spa-port; a "
        "service refuses every datagram for one window after its first start since "
        "boot (`alfwrapper status` there says until when)",
        EX_UNAVAILABLE,
    )


_SET_VERBS = {
    "create": "make the set NAME, empty, or holding FILE's CIDRs (one a line, # comments; "
    "by default /etc/alfwrapper/sets/NAME.list if there is one); nothing if it exists",
    "add": "put CIDRs in it, for every service that names it, from the next packet on",
    "del": "take CIDRs out of it",
    "list": "print its entries (without NAME: the sets)",
    "flush": "empty it",
    "destroy": "remove it (services that hold it keep it until their next start or reload)",
}


def set_parser() -> Parser:
    p = Parser(
        prog="alfwrapper set",
        usage="alfwrapper set {create,add,del,list,flush,destroy} [NAME] [CIDR...] "
        "[--timeout SECONDS]",
        description="Named sets: the host's lists of prefixes that services name in "
        "allow-set and deny-set, changed while they run.  "
        + "; ".join(f"{verb}: {text}" for verb, text in _SET_VERBS.items())
        + ".",
        epilog=examples(
            "alfwrapper set create blocklist",
            "alfwrapper set add blocklist 198.51.100.7 2001:db8:bad::/48 --timeout 3600",
            "alfwrapper set del blocklist 198.51.100.7",
            "alfwrapper set list blocklist",
        ),
    )
    p.add_argument("verb", choices=list(_SET_VERBS), help="what to do")
    p.add_argument("name", nargs="?", default="", metavar="NAME", help="the set's name")
    p.add_argument("cidrs", nargs="*", metavar="CIDR", help="addresses or subnets (create: FILE)")
    p.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                   help="add: the entries lapse after this long (default: never)")  # fmt: skip
    p.add_argument("--size", type=int, default=0, metavar="N",
                   help="create: the entries each of its maps holds (default 65536)")  # fmt: skip
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
    if not wants_cidrs and args.cidrs and verb != "create":
        raise AlfError(f"set {verb} {name}", "takes no CIDR", f"alfwrapper set {verb} NAME",
                       EX_USAGE)  # fmt: skip
    if args.timeout and verb != "add" or not (args.timeout == 0 or 0.001 <= args.timeout <= 1e8):
        raise AlfError("--timeout", "is for set add, 0.001 to 100000000 seconds",
                       "give it to set add", EX_USAGE)  # fmt: skip
    if verb == "create":
        if len(args.cidrs) > 1:
            raise AlfError(f"set create {name}", "takes one FILE", "give one list file", EX_USAGE)
        default = sets.list_file(name)
        path = args.cidrs[0] if args.cidrs else str(default) if default.exists() else ""
        made = sets.create(name, sets.read_list(path) if path else (),
                           args.size or sets.DEFAULT_SIZE)  # fmt: skip
        print(f"set {name}: {'created' if made else 'exists already'}"
              + (f" from {path}" if made and path else ""))  # fmt: skip
    elif verb == "add":
        prefixes = parse_cidrs(args.cidrs)
        sets.add(name, prefixes, args.timeout)
        lapse = f", lapsing in {args.timeout:g} s" if args.timeout else ""
        print(f"set {name}: {len(prefixes)} added{lapse}")
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
    elif not sets.destroy(name):
        raise AlfError(f"set {name}", "does not exist", "alfwrapper set list", EX_USAGE)
    else:
        print(f"set {name}: destroyed")
    return 0


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
    p.add_argument("--config", default="/etc/alfwrapper/crowdsec.toml", metavar="FILE",
                   help="the bouncer's TOML file (the default: this one)")  # fmt: skip
    p.add_argument("--key-file", default="", metavar="FILE",
                   help="read the API key from FILE, not the config's api-key-file (the "
                   "unit's: its credential)")  # fmt: skip
    p.add_argument("--sets", default="", metavar="DIR",
                   help="where the sets' tree is seen (the unit binds it there)")  # fmt: skip
    p.add_argument("--once", action="store_true",
                   help="one full resync, then exit: 0, or its error's code")  # fmt: skip
    p.add_argument("--prepare", action="store_true",
                   help="make the config's set if it does not exist, and exit (the unit's "
                   "ExecStartPre=, as root)")  # fmt: skip
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


def loader_parser() -> Parser:
    from alfwrapper.loader import server  # noqa: PLC0415

    p = Parser(
        prog="alfwrapper loader",
        description="Load filters for users without CAP_BPF (run by alfwrapper-loader.service).",
        epilog=examples(
            "alfwrapper loader    # socket-activated, by alfwrapper-loader.service",
            "alfwrapper loader --listen /run/alfwrapper/loader.sock --max-programs 16",
        ),
    )
    server.add_options(p)
    return p


def loader_main(argv: Sequence[str]) -> int:
    from alfwrapper.loader import server  # noqa: PLC0415

    return server.main(loader_parser().parse_args(argv))


def generator_parser() -> Parser:
    p = Parser(
        prog="alfwrapper generator",
        description="systemd's generator: Accept=yes socket units that name their policy "
        "(X-AlfwrapperPolicy=) get it as IPAddressAllow=, so denied peers are never accepted.",
        epilog=examples(
            "alfwrapper generator /run/systemd/generator    # as systemd runs it",
            "systemctl cat alfwrapper-sshd.socket           # the drop-in it wrote",
        ),
    )
    p.add_argument("normal", help="the folder for drop-ins (systemd.generator(7))")
    p.add_argument("early", nargs="?", help="unused")
    p.add_argument("late", nargs="?", help="unused")
    return p


def generator_main(argv: Sequence[str]) -> int:
    from alfwrapper.lifecycle import socket_units  # noqa: PLC0415

    args = generator_parser().parse_args(argv)
    # A generator writes nowhere but its output folders (systemd.generator(7)), and
    # runs early in boot, perhaps before /var: no cache is read, marked or written.
    os.environ["ALFWRAPPER_CACHE"] = "off"
    return socket_units.generate(Path(args.normal), os.environ)


class Subcommand(Record):
    parser: Callable[[], Parser]
    run: Callable[[Sequence[str]], int]


SUBCOMMANDS: dict[str, Subcommand] = {
    "check": Subcommand(check_parser, check_main),
    "explain": Subcommand(explain_parser, explain_main),
    "reload": Subcommand(reload_parser, reload_main),
    **{verb: Subcommand(change_parser(verb), change_main(verb)) for verb in _CHANGES},
    "show": Subcommand(show_parser, show_main),
    "status": Subcommand(status_parser, status_main),
    "log": Subcommand(log_parser, log_main),
    "gc": Subcommand(gc_parser, gc_main),
    "doctor": Subcommand(doctor_parser, doctor_main),
    "knock": Subcommand(knock_parser, knock_main),
    "set": Subcommand(set_parser, set_main),
    "crowdsec": Subcommand(crowdsec_parser, crowdsec_main),
    "loader": Subcommand(loader_parser, loader_main),
    "generator": Subcommand(generator_parser, generator_main),
}


def parser_of(name: str) -> Parser:
    """The parser of a subcommand, or the wrapper's for ""."""
    return SUBCOMMANDS[name].parser() if name else wrapper_parser()


def completion_parser() -> Parser:
    """The whole command line as one parser, for shell completion (`make completion`
    hands it to shtab): the wrapper's options, and each subcommand's own."""
    top = wrapper_parser()
    subs = top.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, sub in SUBCOMMANDS.items():
        parser = sub.parser()
        subs.add_parser(name, parents=[parser], add_help=False, help=parser.description,
                        description=parser.description)  # fmt: skip
    return top


def stdout_closed() -> bool:
    """Whether standard output's reader is gone (a pipe's last reader closed it, or a
    socket's peer): poll(2) says POLLERR (or POLLHUP) then, for any file."""
    import select  # noqa: PLC0415  (built in; only for this rare path)

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no stdout, or not a real file
        return False


def quit_closed_pipe() -> int:
    """End quietly, as `ls | head` does: the reader of standard output has left (Python
    ignores SIGPIPE, so a write raised EPIPE instead of ending the process).  Standard
    output is pointed at /dev/null first, so that the interpreter's flush at exit, of
    what is still buffered, does not raise again (Python's documented recipe, in the
    signal module's notes on SIGPIPE); the status is the one a shell reports for a
    process the closed pipe killed (man/alfwrapper.1, EXIT STATUS)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EX_PIPE_CLOSED


def commands() -> str:
    """What a bare `alfwrapper` and `alfwrapper help` print: each way to run it, a line."""
    import re  # noqa: PLC0415  (not for a start)

    lines = [
        "usage: alfwrapper [RULES] [SOCKETS] -- COMMAND [ARG...]   (alfwrapper --help)",
        "       alfwrapper SUBCOMMAND ...   (alfwrapper help SUBCOMMAND)",
        "",
        "subcommands:",
    ]
    for name, sub in SUBCOMMANDS.items():
        about = re.split(r"[:;.(]|, ", sub.parser().description or "", maxsplit=1)[0].strip()
        lines.append(f"  {name:10} {about if len(about) <= 66 else about[:63] + '...'}")
    lines += ["", "man alfwrapper; guides in /usr/share/doc/alfwrapper"]
    return "\n".join(lines)


def help_main(argv: Sequence[str]) -> int:
    """`alfwrapper help [SUBCOMMAND]`, and a bare `alfwrapper`: the list, or its --help."""
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]].run(["--help"])
    if argv:
        raise AlfError("help", f"no subcommand {excerpt(argv[0])}",
                       "alfwrapper help lists them", EX_USAGE)  # fmt: skip
    print(commands())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] == "help":
        argv = ["help", *argv[1:]]
    activation.own_environment(os.environ)  # before numpy loads
    options = argv[: argv.index("--")] if "--" in argv else argv
    verbose = "-v" in options or "--verbose" in options
    try:
        command = SUBCOMMANDS.get(argv[0]) if argv else None
        if argv[0] == "help":
            code = help_main(argv[1:])
        else:
            code = command.run(argv[1:]) if command is not None else wrapper_main(argv)
        if sys.stdout is not None:
            sys.stdout.flush()  # a reader that left shows here, not at the exit's flush
        return code
    except AlfError as err:
        return report(err, verbose)
    except KeyboardInterrupt:
        return 130
    except ImportError as err:
        missing = missing_library(err)
        if missing is None:
            raise
        print(missing.line(), file=sys.stderr)
        return missing.exit_code
    except Exception as err:  # noqa: BLE001  (never a traceback unless asked for)
        if isinstance(err, BrokenPipeError) and stdout_closed():  # not the loader's pipe
            return quit_closed_pipe()
        code = internal(err)
        if verbose:
            import traceback  # noqa: PLC0415  (not for a start)

            traceback.print_exc()
        return code
