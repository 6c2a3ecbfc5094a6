"""The argparse parser every subcommand's is made from: usage errors raised as an
AlfError (exit 64), examples in the epilog kept as written.  No subcommand here."""

from __future__ import annotations

import argparse
import os
from typing import Any, NoReturn

from alfwrapper.errors import EX_USAGE, AlfError


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
