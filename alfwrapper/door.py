"""The way in: ``alfwrapper`` and ``python -m alfwrapper`` start here.

A connection handed over by an Accept=yes socket whose peer a kept verdict judges
is dealt with here, before the command line is even parsed
(lifecycle/verdicts.py): a denied peer reset, an allowed one's COMMAND exec'd.
Everything else goes to cli.main.  Nothing else is imported first: a flood of
denied connections costs Python's start-up and little more.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing and collections.abc cost a denied peer milliseconds
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    from alfwrapper.errors import AlfError, internal, report  # noqa: PLC0415
    from alfwrapper.lifecycle import verdicts  # noqa: PLC0415

    try:
        if verdicts.decided_early(args):
            return 0
    except AlfError as err:  # an allowed peer's COMMAND, once its confinement began
        options = args[: args.index("--")] if "--" in args else args
        return report(err, "-v" in options or "--verbose" in options)
    except Exception as err:  # noqa: BLE001  (as cli.main: one line, no traceback)
        return internal(err)
    from alfwrapper.cli.main import main as cli_main  # noqa: PLC0415

    return cli_main(args)
