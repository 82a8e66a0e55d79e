"""Copy a program into each writable directory given and run it: directly, through the dynamic
loader, and as executable memory mapped from the file. Running it is an escape."""

import errno
import glob
import mmap
import os
import shutil
import subprocess

from _common import ARGS, attempt


def run(argv):
    """Run a program; a loader that could not map it reports the kernel's refusal in text."""
    done = subprocess.run(argv, capture_output=True)
    if done.returncode:
        code = errno.EPERM if b"not permitted" in done.stderr else errno.EACCES
        raise OSError(code, done.stderr.decode(errors="replace").strip())
    return "it ran"


def map_exec(path):
    with open(path, "rb") as f:
        mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC).close()


loaders = glob.glob("/lib64/ld-linux*.so*") + glob.glob("/lib/ld-linux*.so*")
for directory in ARGS:
    program = os.path.join(directory, "copied-true")
    shutil.copy("/usr/bin/true", program)
    os.chmod(program, 0o755)
    attempt(f"execute {program}", lambda p=program: run([p]))
    for loader in loaders[:1]:
        attempt(f"execute {program} via {loader}", lambda p=program, ld=loader: run([ld, p]))
    attempt(f"mmap PROT_EXEC {program}", lambda p=program: map_exec(p))
