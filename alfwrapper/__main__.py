"""``python -m alfwrapper``."""

import sys

from alfwrapper.cli import main

sys.exit(main(sys.argv[1:]))
