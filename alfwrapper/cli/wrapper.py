"""``alfwrapper [OPTIONS] -- COMMAND``: running a service, the wrapper's options, and
``parse_policy``, the Policy of a wrapper's command line (reload, explain SERVICE and
the bind supervisor parse a running service's options with it)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from alfwrapper import __version__
from alfwrapper.cli.options import add_rule_options, add_socket_options, policy_from_args
from alfwrapper.cli.parser import Parser, examples
from alfwrapper.errors import EX_USAGE, AlfError
from alfwrapper.host import activation, capabilities
from alfwrapper.lifecycle import wrapper
from alfwrapper.policy.files import Policy
from alfwrapper.policy.rules import service_name

USAGE = """\
alfwrapper [--policy NAME|PATH] [RULE OPTIONS] [--listen ADDR:PORT [--name NAME]] -- COMMAND...
       alfwrapper SUBCOMMAND ...    (the subcommands are listed below; each has --help)"""


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options, and COMMAND: everything after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        return argv[:split], argv[split + 1 :]
    return argv, []


def wrapper_parser(subcommands: Iterable[str] = ()) -> Parser:
    """The wrapper's parser.  Its epilog lists ``subcommands``, main's table, which is a
    layer above this module; parse_policy, parsing options the wrapper took, gives none."""
    names = ", ".join(subcommands)
    listed = f"\n\nsubcommands (alfwrapper SUBCOMMAND --help):\n  {names}" if names else ""
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
        + listed,
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


def wrapper_main(argv: Sequence[str], subcommands: Iterable[str]) -> int:
    """``alfwrapper [OPTIONS] -- COMMAND``: its help lists ``subcommands``."""
    diverted = activation.divert_inetd_streams()  # before any output: it could reach a peer
    options, command = _split_command(argv)
    if "--print-filter" in options:
        raise AlfError(
            "--print-filter",
            "is an option of `alfwrapper check` now",
            "run alfwrapper check --print-filter [RULE OPTIONS]",
            EX_USAGE,
        )
    args = wrapper_parser(subcommands).parse_args(options)
    policy = policy_from_args(args, command, os.environ)
    service = service_name(args.service, activation.unit_of_this_process(), policy.command)
    return wrapper.run(
        policy, service, options, keep_capabilities=not args.no_capabilities, diverted=diverted
    )
