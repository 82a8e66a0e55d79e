"""Output flood: write the given number of bytes to stdout as fast as possible."""

import os

from _common import ARGS

left = int(ARGS[0])
chunk = b"flood " * (1 << 17)
while left > 0:
    left -= os.write(1, chunk[:left])
