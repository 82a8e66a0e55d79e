"""Copy a program into each writable directory given (the first argument says how to run it)
and run it: `direct` (execve), `loader` (the dynamic loader maps it: `ld.so PROGRAM`), `mmap`
(map it executable, and map it readable then mprotect it executable). Running it is an escape."""

import ctypes
import errno
import glob
import mmap
import os
import secrets
import shutil
import subprocess

from _common import ARGS, CannotTry, Refused, attempt, errno_in, libc

# What glibc's ld.so says when it cannot map the program executable (it names no errno).
LOADER_REFUSED = b"failed to map segment from shared object"


def run(argv):
    """Run a program (an exec refused raises its errno here, as subprocess reports it)."""
    done = subprocess.run(argv, capture_output=True)
    if done.returncode == 0:
        return "it ran"
    said = done.stderr.decode(errors="replace").strip()
    if LOADER_REFUSED in done.stderr:
        raise Refused("LOADER_MAP_REFUSED", said)
    code = errno_in(said)
    if code is None:
        raise CannotTry(f"exited {done.returncode}: {said[-120:]}")
    raise OSError(getattr(errno, code), said)


def map_exec(path):
    with open(path, "rb") as f:
        mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC).close()
    return "mapped executable"


def protect_exec(path):
    """Map it readable, then ask for PROT_EXEC on that mapping."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open(path, "rb") as f:
        address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, f.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise CannotTry(f"mmap PROT_READ: {os.strerror(ctypes.get_errno())}")
    if libc.mprotect(address, 4096, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return "made executable"


how, directories = ARGS[0], ARGS[1:]
loaders = sorted(glob.glob("/lib64/ld-linux*.so*") + glob.glob("/lib/ld-linux*.so*"))
for directory in directories:
    # (a name of this run's alone: where a test switched the mount view off, /tmp and /dev/shm
    # are the host's, shared with every other run; a pid is not unique in a pid namespace)
    program = os.path.join(directory, f"copied-true-{secrets.token_hex(8)}")
    name = os.path.join(directory, "copied-true")
    shutil.copy("/usr/bin/true", program)
    os.chmod(program, 0o755)
    if how == "direct":
        attempt(f"execute {name}", lambda p=program: run([p]))
    elif how == "loader":
        if not loaders:
            print(f"execute {name} via ld.so: error no dynamic loader found", flush=True)
        for loader in loaders[:1]:
            attempt(f"execute {name} via {loader}", lambda p=program, ld=loader: run([ld, p]))
    else:
        attempt(f"mmap PROT_EXEC {name}", lambda p=program: map_exec(p))
        attempt(f"mprotect PROT_EXEC {name}", lambda p=program: protect_exec(p))
    os.unlink(program)
