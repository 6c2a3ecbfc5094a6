"""The rule options (one per policy key) and the socket options, shared by the wrapper,
check, explain and reload, and the one way they make a Policy (``policy_from_args``),
from --policy files and rule options alike."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from alfwrapper.errors import EX_USAGE, AlfError, excerpt
from alfwrapper.host import activation
from alfwrapper.policy.files import (
    KEYS,
    Entry,
    Policy,
    build_policy,
    cli_entry,
    read_policy,
    split_scope,
)
from alfwrapper.policy.rules import SOCKET_NAME_RULE, ListenSpec, parse_listen, valid_socket_name


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
