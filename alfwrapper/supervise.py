"""``python3 -m alfwrapper.supervise``: the bind supervisor's entry (lifecycle/intercept.py),
which builds the policy again after `alfwrapper reload` as reload does, through the command
line's parser (cli.wrapper.parse_policy): a layer above lifecycle, as reload's caller is."""

from __future__ import annotations

import sys

from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.lifecycle.intercept import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], parse_policy))
