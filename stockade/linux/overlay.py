"""A write root as an overlay (`filesystem.workspace = "overlay"`): the real directory is the
read-only lower layer, and every write lands in an upper layer in the launch's change set
(stockade/lifecycle/changes.py), which the owner reviews, applies or discards after the run.

The overlay is made in the sandbox's own user namespace by its pid 1, as every other mount of
the view is: through descriptors (fsopen, fsconfig FSCONFIG_SET_FD, fsmount; Linux 6.13 takes
overlay layers as descriptors), so no path of the layers is looked up by name once opened
without following symbolic links. `userxattr` is what lets an unprivileged user namespace
mount it: overlayfs then keeps its own metadata (opaque directories) in `user.overlay.*`
extended attributes of the upper layer, and deletions are whiteouts (character devices 0:0).
The mount carries the write root's own attributes (nosuid, nodev, noexec unless
exec_from_write), so nothing written there runs, whichever layer it lies in.
"""

from __future__ import annotations

import errno
import os

from stockade.errors import SetupError, UnenforceableError
from stockade.lifecycle.changelayout import CAPABILITY, UPPER, WORK, layer_dir
from stockade.linux.mountapi import open_path_nofollow
from stockade.linux.syscalls import number, syscall

FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_FD = 5
FSCONFIG_CMD_CREATE = 6

def mount(lower_fd: int, changes_dir: str, index: int, attrs: int) -> int:
    """A detached overlay of the directory open at `lower_fd` (an O_PATH descriptor), its
    upper and work directories those of layer `index` of the change set `changes_dir`, with
    mount attributes `attrs`; returns the mount's descriptor."""
    where = layer_dir(changes_dir, index)
    opened: list[int] = []
    try:
        try:
            upper = open_path_nofollow(os.path.join(where, UPPER))
            opened.append(upper)
            work = open_path_nofollow(os.path.join(where, WORK))
            opened.append(work)
        except OSError as exc:
            raise SetupError("overlay_layers_missing", f"{CAPABILITY}: the change set's "
                             f"layers at {where} cannot be opened ({exc.strerror})",
                             stage="mount") from None
        fs = _fsopen()
        opened.append(fs)
        try:
            _set_fd(fs, "lowerdir+", lower_fd)
            _set_fd(fs, "upperdir", upper)
            _set_fd(fs, "workdir", work)
            # user.overlay.* metadata: the only kind an unprivileged user namespace may
            # write; it also leaves redirect_dir and metacopy off, so a renamed directory is
            # copied up whole and the upper layer alone says what changed.
            syscall(number("fsconfig"), fs, FSCONFIG_SET_FLAG, b"userxattr", None, 0)
            syscall(number("fsconfig"), fs, FSCONFIG_CMD_CREATE, None, None, 0)
            return syscall(number("fsmount"), fs, 1, attrs)
        except OSError as exc:
            raise _refusal(exc) from None
    finally:
        for fd in opened:
            os.close(fd)


def _fsopen() -> int:
    try:
        return syscall(number("fsopen"), b"overlay", 1)
    except OSError as exc:
        raise UnenforceableError(CAPABILITY, f"this kernel offers no overlay filesystem "
                                 f"({exc.strerror}); use filesystem.workspace = \"direct\"",
                                 ) from None


def _set_fd(fs: int, key: str, fd: int) -> None:
    syscall(number("fsconfig"), fs, FSCONFIG_SET_FD, key.encode(), None, fd)


def _refusal(exc: OSError) -> UnenforceableError:
    """Why the kernel would not make the overlay, in the user's terms."""
    if exc.errno in (errno.ELOOP, errno.EBUSY):
        why = ("the write root and Stockade's state directory overlap (an overlay's layers "
               "may not lie inside each other): choose a state directory outside the "
               "workspace (--state-dir, STOCKADE_STATE_DIR)")
    elif exc.errno == errno.EINVAL:
        why = ("the kernel refused the layers (overlay layers as descriptors need Linux "
               "6.13; the state directory's filesystem must take user extended attributes)")
    else:
        why = exc.strerror or str(exc)
    return UnenforceableError(CAPABILITY, f"the copy-on-write workspace cannot be mounted: "
                              f"{why}")
