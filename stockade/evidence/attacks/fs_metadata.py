"""Change the metadata of each path given: its mode (chmod) and its times (utime). Any success
is an escape: a file outside the write roots must not change in any way."""

import os

from _common import ARGS, attempt

for target in ARGS:
    attempt(f"chmod {target}", lambda t=target: os.chmod(t, 0o777))
    attempt(f"utime {target}", lambda t=target: os.utime(t, (0, 0)))
