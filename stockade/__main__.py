"""`python -m stockade`: the command line (see stockade/program.py and `stockade.cli`)."""

import sys

from stockade.program import main

if __name__ == "__main__":
    sys.exit(main())
