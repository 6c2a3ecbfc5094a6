"""``alfwrapper check`` and ``alfwrapper explain``: questions about a policy (and, for
explain SERVICE, about the program in force on a running service)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from alfwrapper.cli.options import add_rule_options, add_socket_options, policy_from_args
from alfwrapper.cli.parser import Parser, examples
from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.errors import EX_USAGE, AlfError
from alfwrapper.policy.files import KEYS
from alfwrapper.policy.rules import check_service


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
    p.add_argument(
        "--spa-datagram",
        metavar="HEX",
        help="with --knock-spa: the verdict of the socket's SPA socket on this "
        "datagram (hexadecimal), sent from --from",
    )
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
