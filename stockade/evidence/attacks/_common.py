"""Shared by the attack programs: each attempt prints one line, `name: outcome`.

An outcome is `denied CODE` (the attempt failed: an errno's name, or what the attack saw
instead, such as PEER_REFUSED), `ALLOWED detail` (it worked: an escape), `error detail` (the
attempt could not even be tried: a missing tool, a broken set-up; never a denial) or `note
detail` (information). argv[1] is the launch's marker, which lets the host find any process
that outlives the sandbox; the attack's own arguments follow it.
"""

import ctypes
import errno
import os
import platform
import sys
import time

MARKER = sys.argv[1]
ARGS = sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
_kept = []  # buffers handed to the kernel by address stay alive until the program ends

# System call numbers by architecture (x86_64, and the generic table of aarch64).
_NUMBERS = {
    "x86_64": {"clone": 56, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "ptrace": 101, "process_vm_readv": 310, "add_key": 248, "keyctl": 250,
               "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
               "open_tree": 428, "fsopen": 430, "clone3": 435},
    "aarch64": {"clone": 220, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
                "ptrace": 117, "process_vm_readv": 270, "add_key": 217, "keyctl": 219,
                "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
                "open_tree": 428, "fsopen": 430, "clone3": 435},
}
NR = _NUMBERS[platform.machine()]


class Refused(OSError):
    """A refusal the attack observed rather than an errno it got (`code`: what it saw)."""

    def __init__(self, code, text=""):
        super().__init__(text or code)
        self.code = code


class CannotTry(Exception):
    """The attempt could not be made at all (reported as `error`, never as a denial)."""


def attempt(name, action):
    """Run `action()`: an OSError is a denial, CannotTry an error, anything else an escape."""
    try:
        detail = action()
    except CannotTry as exc:
        print(f"{name}: error {exc}", flush=True)
        return False
    except Refused as exc:
        print(f"{name}: denied {exc.code}", flush=True)
        return False
    except OSError as exc:
        code = errno.errorcode.get(exc.errno, exc.errno) if exc.errno else type(exc).__name__
        print(f"{name}: denied {code}", flush=True)
        return False
    print(f"{name}: ALLOWED {'' if detail is None else detail}".rstrip(), flush=True)
    return True


_BY_MESSAGE = {os.strerror(code): name for code, name in errno.errorcode.items()}


def errno_in(text):
    """The errno a tool's message ends with (as ld.so or a shell says it), or None."""
    for message, name in _BY_MESSAGE.items():
        if text.rstrip().endswith(message):
            return name
    return None


def note(name, detail):
    print(f"{name}: note {detail}", flush=True)


def checked(rc):
    """A libc return value, or OSError with errno when it is -1."""
    if rc == -1:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return rc


def syscall(number, *args):
    return checked(libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args]))


def pointer(data):
    """The address of a buffer holding `data` (kept alive)."""
    buffer = ctypes.create_string_buffer(data, len(data))
    _kept.append(buffer)
    return ctypes.addressof(buffer)


def read(path):
    """Read a file; the 'detail' of a successful read is its first bytes."""
    with open(path, "rb") as f:
        return f.read(64)


def reveal(path):
    """List a directory or read a file; an empty answer (a mask) reveals nothing: EMPTY."""
    found = os.listdir(path) if os.path.isdir(path) else read(path)
    if not found:
        raise Refused("EMPTY", "nothing revealed")
    return found


def write(path, data=b"written by a sandboxed attack\n", mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def seen_as(pid, tag):
    """Whether `pid` is visible here and its command line holds `tag` (None: not visible)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return tag.encode() in f.read()
    except OSError:
        return None


def daemonize(seconds=30):
    """Double-fork a daemon in a new session, stdio closed, that sleeps `seconds` (it carries
    MARKER in its argv: the host looks for it afterwards); the caller goes on."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            time.sleep(seconds)
        os._exit(0)
    note("daemon", "started")
