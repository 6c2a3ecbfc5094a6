"""The way in: ``alfwrapper`` and ``python -m alfwrapper`` start here.

A connection handed over by an Accept=yes socket whose peer a kept verdict denies
is reset here, before the command line is even parsed (lifecycle/verdicts.py);
everything else goes to cli.main.  Nothing else is imported first: a flood of
denied connections costs Python's start-up and little more.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing and collections.abc cost a denied peer milliseconds
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    from alfwrapper.lifecycle import verdicts  # noqa: PLC0415

    if verdicts.denied_early(args):
        return 0
    from alfwrapper.cli import main as cli_main  # noqa: PLC0415

    return cli_main(args)
