"""Command line: ``alfwrapper [OPTIONS] -- COMMAND [ARG...]`` and ``alfwrapper doctor``.

``main`` is the only place that turns errors into a message and an exit code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from alfwrapper import __version__, activation, attach, compiler, doctor, sockets
from alfwrapper.errors import EX_NOINPUT, EX_SOFTWARE, EX_USAGE, AlfError
from alfwrapper.rules import (
    Config,
    ListenSpec,
    Prefix,
    SubnetRules,
    parse_listen,
    parse_option_prefix,
    read_rule_file,
)
from alfwrapper.subnet_table import build_subnet_table

USAGE = "alfwrapper [OPTIONS] -- COMMAND [ARG...]\n       alfwrapper doctor"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AlfError("usage", message, "see alfwrapper --help or man alfwrapper", EX_USAGE)


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
                f"{name!r} follows no --listen or --listen-datagram",
                "put --name NAME right after the socket it names",
                EX_USAGE,
            )
        if not name or ":" in name or len(name) > 255 or not name.isprintable():
            raise AlfError(
                "--name",
                f"{name!r} is not a valid socket name",
                "use up to 255 printable characters without ':'",
                EX_USAGE,
            )
        last = namespace.listens[-1]
        if last.name != activation.DEFAULT_NAME:
            raise AlfError(
                "--name",
                f"{last} is already named {last.name!r}",
                "give one --name per socket",
                EX_USAGE,
            )
        namespace.listens = [
            *namespace.listens[:-1],
            ListenSpec(last.kind, last.host, last.port, name),
        ]


def _parser() -> _Parser:
    p = _Parser(
        prog="alfwrapper",
        usage=USAGE,
        description="Attach an eBPF source-subnet filter to a service's listening "
        "sockets, then exec the service with them (sd_listen_fds).",
    )
    p.add_argument("--version", action="version", version=f"alfwrapper {__version__}")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="on errors, show details: compiler output, verifier log",
    )
    s = p.add_argument_group("sockets (inherited per sd_listen_fds, and/or created)")
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
    r = p.add_argument_group("source-subnet rules (deny wins; no allow rules = allow all)")
    r.add_argument(
        "--allow", action="append", default=[], metavar="CIDR", help="pass packets from this subnet"
    )
    r.add_argument(
        "--deny", action="append", default=[], metavar="CIDR", help="drop packets from this subnet"
    )
    r.add_argument(
        "--allow-file",
        action="append",
        default=[],
        metavar="FILE",
        help="--allow for each CIDR in FILE (one per line, # comments)",
    )
    r.add_argument(
        "--deny-file",
        action="append",
        default=[],
        metavar="FILE",
        help="--deny for each CIDR in FILE",
    )
    p.add_argument(
        "--print-filter",
        action="store_true",
        help="print the filter's C source as compiled, and exit",
    )
    return p


def parse_config(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    """Parse the wrapper's arguments; COMMAND is everything after the first ``--``."""
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    args = _parser().parse_args(options)
    allow: list[Prefix] = [parse_option_prefix("--allow", c) for c in args.allow]
    deny: list[Prefix] = [parse_option_prefix("--deny", c) for c in args.deny]
    for path in args.allow_file:
        allow += read_rule_file(path)
    for path in args.deny_file:
        deny += read_rule_file(path)
    config = Config(
        listens=tuple(args.listens),
        subnets=SubnetRules(allow=tuple(allow), deny=tuple(deny)),
        command=tuple(command),
    )
    return config, args


def run_wrapper(config: Config, print_filter: bool) -> int:
    """Sockets in, filter on, exec.  Returns only on --print-filter."""
    table = build_subnet_table(config.subnets)
    if print_filter:
        sys.stdout.write(compiler.render(compiler.subnet_source(table)))
        return 0
    if not config.command:
        raise AlfError("usage", "no COMMAND given", "put the program to run after --", EX_USAGE)
    if shutil.which(config.command[0]) is None:
        raise AlfError(
            f"COMMAND {config.command[0]}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )
    inherited = activation.inherit_sockets(os.environ, os.getpid())
    created = [(sockets.open_socket(spec), spec) for spec in config.listens]
    if not inherited and not created:
        raise AlfError(
            "sockets",
            "none inherited (LISTEN_FDS unset) and none to create",
            "add --listen [::]:PORT, or start from a socket unit",
            EX_USAGE,
        )
    loaded = compiler.load_subnet_filter(table)
    all_sockets: list[socket.socket] = [s for s, _ in inherited] + [s for s, _ in created]
    for sock in all_sockets:
        attach.attach_filter(sock, loaded.fd)
    for sock, spec in created:
        sockets.bind_socket(sock, spec)
    names = [n for _, n in inherited] + [spec.name for _, spec in created]
    activation.exec_with_sockets(all_sockets, names, config.command, os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = (
        "-v" in argv[: argv.index("--") if "--" in argv else len(argv)]
        or "--verbose" in argv[: argv.index("--") if "--" in argv else len(argv)]
    )
    try:
        if argv[:1] == ["doctor"]:
            return doctor.main(argv[1:])
        config, args = parse_config(argv)
        return run_wrapper(config, args.print_filter)
    except AlfError as err:
        print(err.line(), file=sys.stderr)
        if verbose and err.details:
            print(err.details.rstrip(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # never a traceback unless asked for
        print(
            f"alfwrapper: internal error: {type(err).__name__}: {err} "
            "(please report it with the output of -v)",
            file=sys.stderr,
        )
        if verbose:
            traceback.print_exc()
        return EX_SOFTWARE
