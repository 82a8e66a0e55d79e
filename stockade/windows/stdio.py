"""The child's three standard handles, following subprocess's conventions (None, PIPE, DEVNULL,
a descriptor, a file object, STDOUT for stderr), each passed as a fresh inheritable duplicate
that is closed once the child has its copy.

None (inherit) is never the owner's own handle: it may be a console, and a console handle lets
its holder read the screen or inject input into it. Instead the child gets a pipe, and a relay
thread copies between that pipe and the owner's descriptor 0, 1 or 2. The relays start only once
the child exists (`start_relays`): before, a stdin relay would take the owner's input for a child
that never comes. A relay passes bytes as they are, as the child's own inherited console handle
would (`_copy`).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from typing import IO

from stockade.launch.backend import Stdio
from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.structs import HANDLE

_RELAY_JOIN = 2.0


class ChildStdio:
    def __init__(self, stdio: Stdio) -> None:
        self.files: list[IO[bytes] | None] = [None, None, None]
        self.handles: list[int] = []  # the inheritable duplicates the child gets
        self._close: list[int] = []  # descriptors only the child needed, ours to close
        self._relays: list[tuple[int, int]] = []  # (index, our end) for relays not yet started
        self._outputs: list[threading.Thread] = []  # relays to the owner's stdout/stderr
        ends: list[int] = []
        try:
            for index, spec in enumerate((stdio.stdin, stdio.stdout, stdio.stderr)):
                merged = index == 2 and spec == subprocess.STDOUT  # stderr is stdout's end
                ends.append(ends[1] if merged else self._child_end(index, spec))
                self.handles.append(_inheritable(ends[index]))
        except BaseException:  # (a later spec failed: nothing made for the earlier ones stays)
            self.close()
            raise

    def _child_end(self, index: int, spec: int | IO | None) -> int:
        if spec is None or spec == subprocess.PIPE:
            read, write = os.pipe()
            ours, theirs = (write, read) if index == 0 else (read, write)
            self._close.append(theirs)
            if spec is None:
                self._relays.append((index, ours))
            else:
                self.files[index] = open(ours, "wb" if index == 0 else "rb")  # noqa: SIM115
            return theirs
        if spec == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            self._close.append(fd)
            return fd
        return spec if isinstance(spec, int) else spec.fileno()

    def start_relays(self) -> None:
        """Start relaying between the child's pipes and the owner's descriptors (once the
        child exists)."""
        relays, self._relays = self._relays, []
        for index, ours in relays:
            self._relay(index, ours)

    def close(self) -> None:
        """Close everything still held, for a launch that failed: the child's ends (if the
        launch failed before handing them over), our files, and the pipes of relays that
        never started."""
        self.close_child_ends()
        for file in self.files:
            if file is not None:
                file.close()
        relays, self._relays = self._relays, []
        for _, ours in relays:
            os.close(ours)

    def _relay(self, index: int, ours: int) -> None:
        source, target = (index, ours) if index == 0 else (ours, index)
        thread = threading.Thread(target=_copy, args=(source, target, ours),
                                  name=f"stockade-relay-{index}", daemon=True)
        thread.start()
        if index:
            self._outputs.append(thread)  # the stdin relay ends with the owner's stdin

    def close_child_ends(self) -> None:
        """Close what only the child needed (after CreateProcessW, or on failure)."""
        for handle in self.handles:
            win32().CloseHandle(handle)
        self.handles = []
        for fd in self._close:
            os.close(fd)
        self._close = []

    def join_relays(self) -> None:
        """Wait (briefly) for the output relays to drain once the tree is gone."""
        for thread in self._outputs:
            thread.join(_RELAY_JOIN)


def _copy(source: int, target: int, ours: int) -> None:
    """Copy bytes from `source` to `target` as they come, until either end closes; then close
    `ours`. The bytes are passed as they are, through the descriptors themselves (ReadFile,
    WriteFile): a file object opened on a console descriptor would be a console reader or
    writer that takes the bytes as UTF-8 (CPython's _WindowsConsoleIO), garbling a child's
    output in its code page, which a console shows as it would the child's own."""
    try:
        while chunk := os.read(source, 65536):
            while chunk:  # (a console write may take only part: CPython caps it at 32767)
                chunk = chunk[os.write(target, chunk):]
    except OSError:
        pass  # either end went away: the relay is over
    finally:
        os.close(ours)


def _inheritable(fd: int) -> int:
    import msvcrt  # Windows only

    api = win32()
    duplicate = HANDLE()
    api.DuplicateHandle(api.GetCurrentProcess(), msvcrt.get_osfhandle(fd),
                        api.GetCurrentProcess(), ctypes.byref(duplicate), 0, True,
                        c.DUPLICATE_SAME_ACCESS)
    return duplicate.value
