"""The subcommands systemd runs: ``alfwrapper loader`` (alfwrapper-loader.service)
and ``alfwrapper generator`` (systemd.generator(7))."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from alfwrapper.cli.parser import Parser, examples


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
