"""Have the sandbox's supervisor (pid 1; the landlock tier's keeper: the command's parent)
open its own descriptors (its status pipe, its lifeline) and maps for the command: a lookup it
makes from inside its own /proc/<pid> (the command's working directory, a descriptor, its task
directory, a magic link leading there), asked with O_CREAT so that the supervisor's watch of
created names makes it. A descriptor got is an escape: with the status pipe's write end the
command writes its owner's events (a forged exit, forged violations). A descriptor is asked
for reading, never waiting (a pipe is then reopened for writing through the command's own
/proc/self/fd)."""

import errno
import os
import stat

from _common import attempt, note

SUPERVISOR = os.getppid()
HOME = f"/proc/{SUPERVISOR}"


def opened(name, dir_fd=None):
    fd = os.open(name, os.O_CREAT | os.O_RDONLY | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
    got = os.readlink(f"/proc/self/fd/{fd}")
    if stat.S_ISFIFO(os.fstat(fd).st_mode):  # (nothing written: the owner's run goes on)
        os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
        got += " (opened for writing too)"
    return got if not name.endswith("maps") else f"{got}: {len(os.read(fd, 4096))} bytes"


def from_directory(where, name):
    os.chdir(where)
    try:
        return opened(name)
    finally:
        os.chdir("/")


home = os.open(HOME, os.O_PATH | os.O_DIRECTORY)

# Its standard streams and maps are there whatever it is: their refusal is the proof. Its
# other descriptors (found by listing where the command may: else the first 16) are looked
# for its pipes: one got is an escape; one refused is a note, for some (an anonymous inode:
# its seccomp listener, its pidfd) the kernel refuses to reopen in any case.
for name in ("fd/0", "fd/1", "fd/2", "maps"):
    attempt(f"open {name} from the working directory {HOME}",
            lambda n=name: from_directory(HOME, n))
    attempt(f"open {name} from a descriptor of {HOME}", lambda n=name: opened(n, dir_fd=home))
    attempt(f"open {name} from the working directory {HOME}/task/{SUPERVISOR}",
            lambda n=name: from_directory(f"{HOME}/task/{SUPERVISOR}", n))
    attempt(f"open /proc/self/cwd/{name} with the working directory {HOME}",
            lambda n=name: from_directory(HOME, f"/proc/self/cwd/{n}"))
try:
    HELD = sorted(int(n) for n in os.listdir(f"{HOME}/fd") if int(n) > 2)
except OSError:
    HELD = range(3, 16)
for n in HELD:
    name = f"open fd/{n} from the working directory {HOME}"
    try:
        got = from_directory(HOME, f"fd/{n}")
    except OSError as exc:
        note(name, f"not opened: {errno.errorcode.get(exc.errno, exc.errno)}")
    else:
        attempt(name, lambda g=got: g)
