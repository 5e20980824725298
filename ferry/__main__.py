"""`python -m ferry ...`: the `ferry` command without its installed script."""

import sys

from ferry.cli import main

if __name__ == "__main__":
    sys.exit(main())
