"""The subcommands that read: status, log (a running service's counters and drop log,
here or through the loader) and doctor (this machine, or a COMMAND behind alfwrapper)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from alfwrapper.cli.parser import Parser, examples
from alfwrapper.errors import EX_CONFIG, EX_USAGE, AlfError
from alfwrapper.policy.rules import check_service


def _observe_ops() -> Any:
    """The commands that read running services (status, metrics, the drop log), the
    same two ways."""
    from alfwrapper.loader import client  # noqa: PLC0415
    from alfwrapper.observe import status as observe  # noqa: PLC0415

    client.use_if_needed()
    return observe


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
    how.add_argument(
        "--prometheus", action="store_true", help="print the counters in Prometheus' text format"
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        default="",
        help="write to FILE instead, atomically (for node_exporter)",
    )
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
                "doctor",
                "--inetd and --no-capabilities go with --for",
                "add --for COMMAND",
                EX_USAGE,
            )
        from alfwrapper.observe import doctor  # noqa: PLC0415

        return doctor.main()
    if not args.command:
        raise AlfError(
            "doctor --for",
            "no COMMAND given",
            "add the command and its arguments after --for",
            EX_USAGE,
        )
    from alfwrapper.observe import daemons  # noqa: PLC0415

    findings = daemons.examine(args.command, args.inetd, args.no_capabilities)
    for finding in findings:
        print(f"{'ok' if finding.ok else 'problem'}: {finding.text}")
    return 0 if all(f.ok for f in findings) else EX_CONFIG
