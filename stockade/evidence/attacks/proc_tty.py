"""Push keystrokes into a terminal with TIOCSTI and use TIOCLINUX, on a pseudo-terminal of our
own and on stdin (the host's terminal, when the policy inherits it), each made our controlling
terminal first. A successful ioctl is an escape."""

import fcntl
import os
import termios

from _common import attempt, note

TIOCLINUX = 0x541C


def make_controlling(fd):
    try:
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
    except OSError as exc:
        note(f"TIOCSCTTY fd {fd}", exc.strerror)


def refused(exc):
    raise exc


try:
    master, slave = os.openpty()
except OSError as exc:  # no /dev/ptmx in the view (the landlock tier grants none): no pty to use
    slave = exc
for label, fd in (("own pty", slave), ("stdin", 0)):
    if isinstance(fd, OSError):
        attempt(f"TIOCSTI on {label}", lambda e=fd: refused(e))
        continue
    if not os.isatty(fd):
        note(label, "not a terminal")
        continue
    make_controlling(fd)
    attempt(f"TIOCSTI on {label}", lambda f=fd: fcntl.ioctl(f, termios.TIOCSTI, b"#"))
    attempt(f"TIOCLINUX on {label}", lambda f=fd: fcntl.ioctl(f, TIOCLINUX, b"\x07"))
