"""Tamper with a change set in Stockade's state directory (argv: the state directory, then its
set's upper layer): set user.overlay.opaque on the upper layer's directory (the next `apply`
would delete what lies below it on the host), set and remove other extended attributes of a
file in it, and make the state directory writable by every user (chmod 0777). Any of them
working is an escape; the host checks the store's modes and attributes unchanged."""

import os

from _common import ARGS, attempt

state, upper = ARGS[0], ARGS[1]
attempt("setxattr(upper/dir, user.overlay.opaque)",
        lambda: os.setxattr(f"{upper}/dir", "user.overlay.opaque", b"y"))
attempt("setxattr(upper/dir/file, user.planted)",
        lambda: os.setxattr(f"{upper}/dir/file", "user.planted", b"1"))
attempt("removexattr(upper/dir/file, user.kept)",
        lambda: os.removexattr(f"{upper}/dir/file", "user.kept"))
attempt("chmod(state, 0777)", lambda: os.chmod(state, 0o777))
attempt("chmod(upper/dir, 0777)", lambda: os.chmod(f"{upper}/dir", 0o777))
