"""Leave a privilege bit on the host: copy a shell into the workspace (argv: its directory)
and make it setuid or setgid by every call that sets a mode, or (as root: argv[2]) give it a
file capability.
Any success is an escape: the file keeps the bit on the host."""

import os
import shutil

from _common import ARGS, attempt

directory, host_user = ARGS
copy = os.path.join(directory, "sh-copy")
shutil.copy("/bin/sh", copy)
dirfd = os.open(directory, os.O_RDONLY)
capability = bytes.fromhex("0000000201000000000000000000000000000000")  # cap_chown, v2
attempt("chmod 4755", lambda: os.chmod(copy, 0o4755))
attempt("chmod 2755", lambda: os.chmod(copy, 0o2755))
attempt("fchmod 6755", lambda: os.fchmod(os.open(copy, os.O_RDONLY), 0o6755))
attempt("fchmodat 4755", lambda: os.chmod("sh-copy", 0o4755, dir_fd=dirfd))
attempt("open O_CREAT 4755",
        lambda: os.close(os.open(os.path.join(directory, "made"), os.O_CREAT | os.O_WRONLY,
                                 0o4755)))
attempt("mknod S_IFREG 4755", lambda: os.mknod(os.path.join(directory, "node"), 0o104755))
if host_user == "root":  # (only root may set one anywhere: CAP_SETFCAP)
    attempt("setxattr security.capability",
            lambda: os.setxattr(copy, "security.capability", capability))
