"""Create device nodes (/dev/null's and a disk's numbers) in each writable directory given:
a device node is an escape."""

import os
import stat

from _common import ARGS, attempt

for directory in ARGS:
    for name, kind, major, minor in (("char-null", stat.S_IFCHR, 1, 3),
                                     ("char-mem", stat.S_IFCHR, 1, 1),
                                     ("block-sda", stat.S_IFBLK, 8, 0)):
        path = os.path.join(directory, name)
        attempt(f"mknod {path}", lambda p=path, k=kind, a=major, b=minor:
                os.mknod(p, k | 0o666, os.makedev(a, b)))
