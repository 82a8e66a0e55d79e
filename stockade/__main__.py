"""`python -m stockade`: the command line (see `stockade.cli`)."""

import sys

from stockade.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
