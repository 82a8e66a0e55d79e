"""The launcher process, started by the Linux backend with a fresh interpreter.

Invoked as `launcher.main(request_fd, status_fd)`. It reads one frame from `request_fd` (the
request and the compiled seccomp program), enters fresh namespaces and forks the sandbox's pid 1.
Its stdio become the command's. Events go to `status_fd` as JSON lines; `request_fd` stays open
as the lifeline: when the owner dies, it reaches EOF.
"""

from __future__ import annotations

import os
import struct


def read_frame(fd: int) -> tuple[bytes, bytes]:
    """(request, seccomp program) from a frame of two length-prefixed parts."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("request frame truncated")
            data += chunk
        return data
    request_len, bpf_len = struct.unpack("<II", exactly(8))
    return exactly(request_len), exactly(bpf_len)


def encode_frame(request: bytes, bpf: bytes) -> bytes:
    return struct.pack("<II", len(request), len(bpf)) + request + bpf


def main(request_fd: int, status_fd: int) -> None:
    from stockade.errors import StockadeError
    from stockade.launch.request import MAX_FRAME, LaunchRequest
    from stockade.linux import init, ns

    try:
        raw, bpf = read_frame(request_fd)
        if len(raw) > MAX_FRAME:
            raise EOFError("request frame too large")
        request = LaunchRequest.decode(raw)
        ns.unshare_all()
        pid = os.fork()
        if pid == 0:
            init.run(request, bpf, status_fd, request_fd)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    except StockadeError as exc:
        init.emit(status_fd, event="error", kind="setup", code=exc.code, message=exc.message,
                  stage="namespaces")
    except (OSError, EOFError) as exc:
        init.emit(status_fd, event="error", kind="setup", code="setup_failed",
                  message=str(exc), stage="launcher")
    except Exception as exc:  # noqa: BLE001 - the owner must get a typed report, not a trace
        init.emit(status_fd, event="error", kind="setup", code="internal_error",
                  message=exc.__class__.__name__, stage="launcher")
    os._exit(70)
