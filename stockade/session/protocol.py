"""The session protocol between a host and a guest agent (specified in docs/protocol.md).

A connection carries length-prefixed frames in both directions:

    u32 length | u8 version | u8 type | u32 command | u8 stream | payload (length - 7 bytes)

big-endian, `length` at most MAX_FRAME. `command` 0 is the session's control channel; each
`exec` opens command N >= 1, whose stdin (stream 0), stdout (1) and stderr (2) are multiplexed on
the same connection. `data` payloads are raw bytes; every other payload is a JSON object whose
fields are checked against the table of its direction (TO_AGENT or TO_HOST): unknown types,
versions or fields, oversized or malformed frames raise ProtocolError, which ends the connection.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from stockade.session.errors import ProtocolError

VERSION = 3  # 2: the host's hello may say keep_detached; 3: a path may be a Windows drive path
# bound on the length field (bytes after it): a command's frame holds any argv the kernel
# takes at the usual 8 MiB stack (ARG_MAX 2 MiB) four times over, room for JSON's escapes
MAX_FRAME = 8 << 20
CHUNK = 64 << 10          # senders split data into frames of at most this many bytes
NONCE_SIZE = 32
STDIN_WINDOW = 256 << 10  # stdin bytes a host may send ahead of the agent's `window` grants
STDIN, STDOUT, STDERR = 0, 1, 2
STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}

_HEADER = struct.Struct(">BBIB")
_LENGTH = struct.Struct(">I")

TYPES = {"hello": 1, "exec": 2, "started": 3, "data": 4, "eof": 5, "result": 6, "cancel": 7,
         "ping": 8, "pong": 9, "shutdown": 10, "error": 11, "window": 12}
_NAMES = {code: name for name, code in TYPES.items()}

# Fatal codes (in `error` on command 0, or raised locally) end the connection.
FATAL_CODES = ("frame_oversized", "frame_invalid", "frame_truncated", "version_unsupported",
               "type_unknown", "address_invalid", "payload_invalid", "field_unknown",
               "field_missing", "field_invalid", "auth_required", "auth_failed",
               "sequence_invalid", "busy", "window_exceeded", "internal")
# Per-command codes (in `error` on command N) end only that command, which never started.
COMMAND_CODES = ("command_not_found", "command_not_executable", "cwd_invalid", "start_failed")


@dataclass(frozen=True)
class Message:
    """One frame. `body` is bytes for `data`, a dict for every other type."""

    type: str
    command: int = 0
    stream: int = 0
    body: dict | bytes = field(default_factory=dict)


def encode(message: Message) -> bytes:
    """The frame for `message` (the sender's own messages are trusted to be well-formed)."""
    if isinstance(message.body, bytes | bytearray | memoryview):
        payload = bytes(message.body)
    else:
        payload = json.dumps(message.body, separators=(",", ":"), ensure_ascii=True).encode()
    head = _HEADER.pack(VERSION, TYPES[message.type], message.command, message.stream)
    return _LENGTH.pack(len(head) + len(payload)) + head + payload


# --- field checks ------------------------------------------------------------------------------

Check = Callable[[object], bool]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _is_number(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and "\0" not in value


def _is_argv(value: object) -> bool:
    return (isinstance(value, list) and 0 < len(value) <= 65536
            and all(_is_text(a) for a in value) and value[0] != "")  # (`-N ''` is an argument)


def _is_env(value: object) -> bool:
    return isinstance(value, dict) and all(
        _is_text(k) and k and "=" not in k and _is_text(v) for k, v in value.items())


def _is_path(value: object) -> bool:
    """Absolute: POSIX (`/...`) or a Windows drive path (`X:\\...`, a Windows guest's)."""
    return _is_text(value) and (value.startswith("/") or (
        len(value) >= 3 and value[0].isascii() and value[0].isalpha() and value[1:3] == ":\\"))


def _is_nonce(value: object) -> bool:
    return (isinstance(value, str) and len(value) == 2 * NONCE_SIZE
            and all(c in "0123456789abcdef" for c in value))


def _is_observed(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_int(v)
                                           for k, v in value.items())


def _is_positive(value: object) -> bool:
    return _is_number(value) and value > 0


def _is_grant(value: object) -> bool:
    return _is_int(value) and 0 < value <= STDIN_WINDOW


_TEXT: Check = _is_text
_CODE_MESSAGE = {"code": _TEXT, "message": _TEXT}

# type -> (addressing, fields). Addressing: "session" (command 0, stream 0), "command"
# (command >= 1, stream 0: for data and eof, that is stdin), "output" (command >= 1, stream 1
# or 2), "any" (command 0 or N, stream 0). Fields: name -> check; every field
# is required except those whose check accepts None and that are absent (see _check_fields).
Table = dict[str, tuple[str, dict[str, Check] | None]]

TO_AGENT: Table = {
    "hello": ("session", {"nonce": _is_nonce,
                          "keep_detached": _optional(lambda v: isinstance(v, bool))}),
    "exec": ("command", {"argv": _is_argv, "cwd": _is_path, "env": _is_env,
                         "timeout": _optional(_is_positive)}),
    "data": ("command", None),
    "eof": ("command", {}),
    "cancel": ("command", {}),
    "ping": ("session", {"seq": _is_int}),
    "shutdown": ("session", {}),
    "error": ("any", _CODE_MESSAGE),
}

TO_HOST: Table = {
    "hello": ("session", {"agent": _TEXT, "pid": _is_int, "observed": _is_observed}),
    "started": ("command", {"pid": _is_int}),
    "data": ("output", None),
    "eof": ("output", {}),
    "window": ("command", {"bytes": _is_grant}),
    "result": ("command", {"exit_code": _optional(_is_int), "signal": _optional(_is_int),
                           "timed_out": lambda v: isinstance(v, bool),
                           "cancelled": lambda v: isinstance(v, bool),
                           "start": _is_number, "wall": _is_number, "user": _is_number,
                           "system": _is_number}),
    "pong": ("session", {"seq": _is_int}),
    "error": ("any", _CODE_MESSAGE),
}


# --- decoding ----------------------------------------------------------------------------------


class Decoder:
    """Turns a byte stream into checked Messages of one direction (`table`)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        """The complete frames in what has arrived so far; raises ProtocolError at the first
        bad one (an oversized frame is refused as soon as its length prefix arrives)."""
        self._buffer += data
        messages = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise ProtocolError("frame_oversized",
                                    f"frame of {length} bytes exceeds the {MAX_FRAME}-byte bound")
            if length < _HEADER.size:
                raise ProtocolError("frame_invalid", f"frame of {length} bytes has no header")
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            frame = bytes(self._buffer[_LENGTH.size:end])
            del self._buffer[:end]
            messages.append(parse(frame, self.table))
        return messages

    def finish(self) -> None:
        """The stream ended: raise `frame_truncated` if it ended inside a frame."""
        if self._buffer:
            raise ProtocolError("frame_truncated", "the connection ended inside a frame")


def parse(frame: bytes, table: Table) -> Message:
    """One frame without its length prefix, checked against `table`."""
    version, code, command, stream = _HEADER.unpack_from(frame)
    if version != VERSION:
        raise ProtocolError("version_unsupported",
                            f"protocol version {version} (this side speaks {VERSION})")
    name = _NAMES.get(code)
    if name is None or name not in table:
        raise ProtocolError("type_unknown", f"message type {code} is not known in this direction")
    addressing, fields = table[name]
    _check_address(name, addressing, command, stream)
    payload = frame[_HEADER.size:]
    if fields is None:
        if not payload:
            raise ProtocolError("payload_invalid", "a data frame carries at least one byte")
        return Message(name, command, stream, payload)
    return Message(name, command, stream, _check_fields(name, _json_object(payload), fields))


def _check_address(name: str, addressing: str, command: int, stream: int) -> None:
    ok = {
        "session": command == 0 and stream == 0,
        "command": command > 0 and stream == 0,
        "output": command > 0 and stream in (STDOUT, STDERR),
        "any": stream == 0,
    }[addressing]
    if not ok:
        raise ProtocolError("address_invalid",
                            f"{name} cannot be sent on command {command}, stream {stream}")


def strict_json_object(data: bytes) -> dict:
    """`data` as a UTF-8 JSON object with no duplicate key and no NaN or Infinity; ValueError
    (or RecursionError) for anything else."""
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
        body = dict(pairs)
        if len(body) != len(pairs):
            raise ValueError("duplicate key")
        return body

    def no_constants(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    body = json.loads(data.decode("utf-8"), object_pairs_hook=no_duplicates,
                      parse_constant=no_constants)
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return body


def _json_object(payload: bytes) -> dict:
    try:
        return strict_json_object(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError("payload_invalid",
                            f"payload is not a JSON object ({exc.__class__.__name__})") from None


def _check_fields(name: str, body: dict, fields: dict[str, Check]) -> dict:
    for key in body:
        if key not in fields:
            raise ProtocolError("field_unknown", f"{name} has no field {key[:64]!r}")
    for key, check in fields.items():
        if key not in body:
            if check(None):
                continue  # an optional field may be left out
            raise ProtocolError("field_missing", f"{name} needs field {key!r}")
        if not check(body[key]):
            raise ProtocolError("field_invalid", f"{name}.{key} has an invalid value")
    return body
