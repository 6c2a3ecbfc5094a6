"""``alfwrapper knock``: the client's side of knocking, a sequence of connection
attempts or (--spa) one single-packet authorization datagram."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from alfwrapper.cli.parser import Parser, examples
from alfwrapper.errors import EX_UNAVAILABLE, EX_USAGE, AlfError
from alfwrapper.policy.files import accepted
from alfwrapper.policy.rules import parse_ports


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
    which.add_argument(
        "--sequence", metavar="P,P,P", help="the source ports, in order (the service's --knock)"
    )
    which.add_argument(
        "--secret",
        metavar="FILE",
        help="derive the current sequence from this secret (the service's --knock-secret)",
    )
    p.add_argument("--steps", type=int, default=3, help="secret sequences' length (default 3)")
    p.add_argument("--window", type=int, default=30, help="secret window seconds (default 30)")
    p.add_argument("--udp", action="store_true", help="knock with UDP datagrams")
    p.add_argument(
        "--spa",
        action="store_true",
        help="single-packet authorization, keyed with --secret (the service's "
        "--knock-secret, or your own --knock-spa-key) (the service's "
        "--knock-spa)",
    )
    p.add_argument(
        "--address",
        metavar="A|sender",
        help="with --spa: the address to open, your public one behind a NAT "
        "(default: the one this host sends from); sender: the one the datagram "
        "comes from, where the service allows it (--knock-spa-sender)",
    )
    p.add_argument(
        "--spa-port",
        type=int,
        metavar="PORT",
        help="with --spa: the SPA socket's UDP port (the service's --knock-spa-port; default PORT)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="with --spa: how long to wait for the service to answer (default 3; 0: do not try)",
    )
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
        raise AlfError(
            "knock --spa",
            "keys its datagram with --secret FILE alone",
            "give --secret, without --sequence or --udp",
            EX_USAGE,
        )
    spa_port = args.spa_port or args.port
    if not 0 < spa_port < 65536 or not 0 <= args.wait <= 60:
        raise AlfError(
            "knock --spa",
            "--spa-port is 1 to 65535, --wait 0 to 60 seconds",
            "use the service's --knock-spa-port",
            EX_USAGE,
        )
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
