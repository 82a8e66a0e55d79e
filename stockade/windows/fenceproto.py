"""The fence service's protocol, on its named pipe (`PIPE`): small, versioned, closed.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON, one object, at most
`MAX_FRAME` bytes; a longer frame, bytes that are not one JSON object, or an object with a key
twice is refused and the connection closed. Every request carries `v` (`VERSION`) and `op`,
and exactly the fields its op defines, each of its type and range; anything else — another
version, an unknown op or field, a missing one — is refused with a stable code:

    {"v": 1, "op": "status"}
        -> {"v": 1, "ok": true, "service": "stockade-fence", "modes": ["allowlist", "any"]}
    {"v": 1, "op": "fence", "mode": "allowlist", "profile": "stockade-ac-<24 hex>",
     "pid": 1234, "proxy_port": 50123}                     (`any`: no proxy_port)
        -> {"v": 1, "ok": true, "filters": 6, "exemption": true}
    {"v": 1, "op": "release"}
        -> {"v": 1, "ok": true}
    any refusal
        -> {"v": 1, "ok": false, "code": "fence_...", "message": "..."}

What the request says is never who asks: the service reads the caller from the kernel
(GetNamedPipeClientProcessId, then that process's token) and the launch's package SID from the
token of the process `pid` names, which must be an AppContainer of the caller's user whose
profile is `profile` (fence.py). One fence per connection; it lasts until `release` or until the
connection closes, whichever comes first.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

from stockade.errors import SetupError
from stockade.windows.identity import PROFILE_NAME

PIPE = "\\\\.\\pipe\\stockade-fence"
SERVICE = "stockade-fence"
VERSION = 1
MAX_FRAME = 4096
MODES = ("allowlist", "any")
_HEADER = struct.Struct(">I")
_MAX_PID = 0xFFFFFFFF
# op -> {field: checker}; every request also has exactly "v" and "op"
_FIELDS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "status": {},
    "fence": {
        "mode": lambda value: value in MODES,
        "profile": lambda value: isinstance(value, str) and bool(PROFILE_NAME.fullmatch(value)),
        "pid": lambda value: type(value) is int and 0 < value <= _MAX_PID,
        "proxy_port": lambda value: type(value) is int and 1 <= value <= 65535,
    },
    "release": {},
}


class ProtocolError(Exception):
    """A frame or request the protocol refuses: `code` (stable) and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(body: dict) -> bytes:
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ProtocolError("fence_frame_too_large", f"a frame of {len(data)} bytes is more "
                            f"than the {MAX_FRAME} the protocol allows")
    return _HEADER.pack(len(data)) + data


def read_frame(read: Callable[[int], bytes]) -> dict | None:
    """The next frame's object, read with `read(n)` (at most n bytes, b"" at the end); None
    when the peer closed between frames."""
    header = _exactly(read, _HEADER.size, between_frames=True)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError("fence_frame_too_large", f"a frame of {size} bytes is more than "
                            f"the {MAX_FRAME} the protocol allows")
    return decode(_exactly(read, size) or b"")


def _exactly(read: Callable[[int], bytes], size: int, between_frames: bool = False
             ) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = read(size - len(data))
        if not chunk:
            if between_frames and not data:
                return None
            raise ProtocolError("fence_frame_invalid", "the connection closed inside a frame")
        data += chunk
    return data


def decode(data: bytes) -> dict:
    def unique(pairs: list[tuple[str, Any]]) -> dict:
        body = dict(pairs)
        if len(body) != len(pairs):
            raise ProtocolError("fence_frame_invalid", "a key appears twice in the frame")
        return body

    try:
        body = json.loads(data.decode("utf-8"), object_pairs_hook=unique)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("fence_frame_invalid", "the frame is not UTF-8 JSON") from None
    if not isinstance(body, dict):
        raise ProtocolError("fence_frame_invalid", "the frame is not a JSON object")
    return body


def request(body: dict) -> dict:
    """`body` if it is a request this version defines exactly; ProtocolError otherwise."""
    if body.get("v") != VERSION or type(body.get("v")) is not int:
        raise ProtocolError("fence_version", f"this service speaks version {VERSION} of the "
                            "protocol; upgrade Stockade and the service together")
    fields = _FIELDS.get(body.get("op"))  # type: ignore[arg-type]
    if fields is None:
        raise ProtocolError("fence_request_invalid", "unknown op")
    if body.get("op") == "fence" and body.get("mode") == "any":
        fields = {name: check for name, check in fields.items() if name != "proxy_port"}
    extra = sorted(set(body) - {"v", "op"} - set(fields))
    missing = sorted(set(fields) - set(body))
    if extra or missing:
        raise ProtocolError("fence_request_invalid",
                            f"unknown field(s) {extra}" if extra else f"missing {missing}")
    wrong = sorted(name for name, check in fields.items() if not check(body[name]))
    if wrong:
        raise ProtocolError("fence_request_invalid", f"invalid value for {wrong}")
    return body


def ok(**fields: object) -> dict:
    return {"v": VERSION, "ok": True, **fields}


def refused(code: str, message: str) -> dict:
    return {"v": VERSION, "ok": False, "code": code, "message": message}


def answer(body: dict | None, stage: str = "network") -> dict:
    """A response's fields, checked as the client reads it: a refusal (or anything that is not
    a response of this version) is a SetupError with its code."""
    if body is None:
        raise SetupError("fence_lost", "the fence service closed the connection",
                         stage=stage)
    if body.get("v") != VERSION or not isinstance(body.get("ok"), bool):
        raise SetupError("fence_version", "the fence service answered in another version of "
                         "its protocol; reinstall it with this Stockade (`stockade fence "
                         "install`)", stage=stage)
    if not body["ok"]:
        code, message = body.get("code"), body.get("message")
        if not (isinstance(code, str) and code.startswith("fence_")
                and isinstance(message, str)):
            raise SetupError("fence_version", "the fence service's refusal is malformed",
                             stage=stage)
        raise SetupError(code, f"the fence service refused: {message}", stage=stage)
    return body
