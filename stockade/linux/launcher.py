"""The launcher process, started by the Linux backend with a fresh interpreter.

Invoked as `launcher.main(request_fd, status_fd)`. It reads one frame from `request_fd` (the
request and the compiled seccomp program), enters fresh namespaces and forks the sandbox's pid 1.
Its stdio become the command's. Events go to `status_fd` as JSON lines; `request_fd` stays open
as the lifeline: when the owner dies, it reaches EOF.
"""

from __future__ import annotations

import os
import struct

# Layers a test can switch off to prove the evidence matrix notices (never set in production:
# only the owner's Python code can pass them, through LinuxBackend(weaken=...)).
WEAKENINGS = frozenset({"seccomp", "landlock", "privileges", "read_only", "protected", "deny",
                        "network", "rlimits"})


def read_frame(fd: int) -> tuple[bytes, bytes, frozenset[str]]:
    """(request, seccomp program, weakenings) from a frame of length-prefixed parts."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("request frame truncated")
            data += chunk
        return data
    request_len, bpf_len, weak_len = struct.unpack("<III", exactly(12))
    request, bpf = exactly(request_len), exactly(bpf_len)
    weaken = frozenset(exactly(weak_len).decode().split(",")) - {""}
    return request, bpf, weaken & WEAKENINGS


def encode_frame(request: bytes, bpf: bytes, weaken: frozenset[str] = frozenset()) -> bytes:
    weak = ",".join(sorted(weaken)).encode()
    return struct.pack("<III", len(request), len(bpf), len(weak)) + request + bpf + weak


def main(request_fd: int, status_fd: int) -> None:
    from stockade.errors import StockadeError
    from stockade.launch.request import MAX_FRAME, LaunchRequest
    from stockade.linux import init, ns

    try:
        init.stage(status_fd, "launcher")
        raw, bpf, weaken = read_frame(request_fd)
        if len(raw) > MAX_FRAME:
            raise EOFError("request frame too large")
        request = LaunchRequest.decode(raw)
        ns.unshare_all(network="network" not in weaken)
        init.stage(status_fd, "namespaces")
        pid = os.fork()
        if pid == 0:
            init.run(request, bpf, weaken, status_fd, request_fd)
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
