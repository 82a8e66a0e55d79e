"""Use the caller's own streams, run from a terminal with stdout and stderr to it: find a
terminal among the standard descriptors, change its settings, read from the descriptors, open
the controlling terminal. Any of them working is an escape (a password typed there, a terminal
left raw)."""

import errno
import fcntl
import os
import termios

from _common import Refused, attempt


def terminal(fd):
    if not os.isatty(fd):
        raise OSError(errno.ENOTTY, "not a terminal")
    return "a terminal"


def change_settings():
    done = []
    for fd in (0, 1, 2):
        try:
            settings = termios.tcgetattr(fd)
            settings[3] &= ~termios.ECHO
            termios.tcsetattr(fd, termios.TCSANOW, settings)
            done.append(fd)
        except termios.error:
            continue
    if not done:
        raise Refused("NO_TERMINAL", "no terminal to change")
    return f"changed through {done}"


def read_typed():
    for fd in (0, 1, 2):
        try:
            data = os.read(fd, 1024)
        except OSError:
            continue
        if data:
            return f"read {data!r} from fd {fd}"
    raise Refused("NOTHING_READ", "nothing to read")


for fd in (0, 1, 2):
    attempt(f"fd {fd} is the host terminal", lambda fd=fd: terminal(fd))
attempt("change the terminal's settings", change_settings)
attempt("read what is typed on it", read_typed)
def controlling_terminal():
    """Make a terminal among the standard descriptors ours (we lead a session of our own), then
    open it as /dev/tty."""
    for fd in (0, 1, 2):
        try:
            fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
            break
        except OSError:
            continue
    os.close(os.open("/dev/tty", os.O_RDWR))
    return "opened /dev/tty"


attempt("open the controlling terminal", controlling_terminal)
