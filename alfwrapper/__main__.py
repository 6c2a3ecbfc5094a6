"""``python -m alfwrapper``."""

import sys

from alfwrapper.door import main

sys.exit(main(sys.argv[1:]))
