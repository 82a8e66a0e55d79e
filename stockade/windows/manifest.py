"""The one-shot broker's frames (broker.py): the manifest the host writes for one launch, the
control frame it sends the broker, and the broker's answer. Each is one JSON object in canonical
form (sorted keys, no spaces, ASCII), of one protocol version, closed (a field not named here
is refused, a missing one too) and bounded in size; anything else is a typed refusal
(`BrokerError`, a `broker_*` code) before any of it is used.

- The manifest: the complete launch request (request.py's encoding; its digest is SHA-256 over
  its canonical form: argv, cwd, roots, network, environment, limits and the rest), the digest
  the host computed for it, the PID of the one broker it is for, a fresh nonce, and the
  launch's context — what the host made for the launch that the request does not say: the
  AppContainer's package SID and its runtime roots' capabilities, its private desktop, its temp
  folder, and the values of the Job's and the standard streams' handles the broker inherits.
- The control frame, sent on the broker's stdin (never in a file): the nonce and the digest
  again, and where the manifest is and which file it is (manifestfile.py's identity).
- The answer, on the broker's stdout: launched (the suspended child's process and thread ids),
  refused (a typed refusal: its kind, code and message) or failed (the launcher's Win32 error).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stockade.errors import BrokerError, RequestError
from stockade.launch.request import MAX_FRAME, LaunchRequest
from stockade.windows import desktop, standing
from stockade.windows import sid as sids

VERSION = 1
MAX_MANIFEST = MAX_FRAME + (16 << 10)  # a request at its own bound, and the rest
MAX_PATH = 1024  # characters of a manifest's path (in the state directory: manifestfile.py)
MAX_CONTROL = 8 << 10  # the nonce, digest and file id, and a path of MAX_PATH \uXXXX escapes
MAX_ANSWER = 32 << 10  # (a message of MAX_MESSAGE \uXXXX escapes fits)
MAX_MESSAGE = 4096  # characters of a refusal's or a failure's message in the answer
NONCE_BYTES = 32

_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{16}")  # volume serial, file index (manifestfile)

Check = tuple[Callable[[Any], bool], str]


def _integer(minimum: int) -> Check:
    return (lambda v: type(v) is int and minimum <= v < 1 << 64), f"an integer from {minimum}"


def _string(limit: int) -> Check:
    return (lambda v: isinstance(v, str) and 0 < len(v) <= limit and "\0" not in v,
            f"a string of 1 to {limit} characters")


_HEX: Check = (lambda v: isinstance(v, str) and bool(_HEX64.fullmatch(v)), "64 hex digits")
_OBJECT: Check = (lambda v: isinstance(v, dict), "an object")


@dataclass(frozen=True)
class Context:
    """What the host made for the launch that the request does not say (the module's
    docstring); the handle values are the broker's, inherited."""

    package_sid: str
    capabilities: tuple[str, ...]
    desktop: str
    temp: str
    job: int
    stdio: tuple[int, int, int]


_CONTEXT: dict[str, Check] = {
    "package_sid": ((lambda v: isinstance(v, str) and sids.is_appcontainer(v)),
                    "a package SID"),
    "capabilities": ((lambda v: isinstance(v, list) and len(v) <= 64
                      and all(isinstance(s, str) and standing.is_capability(s) for s in v)),
                     "runtime roots' capability SIDs"),
    "desktop": ((lambda v: isinstance(v, str) and desktop.is_launch_desktop(v)),
                "a launch's private desktop"),
    "temp": _string(MAX_PATH),
    "job": _integer(1),
    "stdio": ((lambda v: isinstance(v, list) and len(v) == 3
               and all(type(h) is int and 0 < h < 1 << 64 for h in v)), "three handles"),
}


@dataclass(frozen=True)
class Manifest:
    """One launch's authorization, for the broker whose PID is `broker_pid`. `digest` is the
    one the host wrote (`for_launch`: the request's own); the broker recomputes it."""

    broker_pid: int
    nonce: str
    digest: str
    request: LaunchRequest
    context: Context

    @classmethod
    def for_launch(cls, broker_pid: int, nonce: str, request: LaunchRequest,
                   context: Context) -> Manifest:
        return cls(broker_pid, nonce, request.digest, request, context)

    def encode(self) -> bytes:
        return _dumps({"version": VERSION, "broker_pid": self.broker_pid, "nonce": self.nonce,
                       "digest": self.digest, "request": json.loads(self.request.encode()),
                       "context": dataclasses.asdict(self.context)})


_MANIFEST: dict[str, Check] = {"version": _integer(0), "broker_pid": _integer(1),
                               "nonce": _HEX, "digest": _HEX, "request": _OBJECT,
                               "context": _OBJECT}


def decode_manifest(data: bytes) -> Manifest:
    body = _closed(_frame(data, MAX_MANIFEST, "manifest"), _MANIFEST, "manifest")
    context = _closed(body["context"], _CONTEXT, "manifest.context")
    try:
        request = LaunchRequest.decode(_dumps(body["request"]))
    except RequestError as exc:  # (its own unknown fields, version, types, bound)
        raise BrokerError("broker_request_invalid", f"the manifest's request: {exc.message}") \
            from None
    return Manifest(body["broker_pid"], body["nonce"], body["digest"], request,
                    Context(context["package_sid"], tuple(context["capabilities"]),
                            context["desktop"], context["temp"], context["job"],
                            tuple(context["stdio"])))


@dataclass(frozen=True)
class Control:
    """What the host tells its broker on stdin: the manifest's nonce and digest, its path and
    the identity of the file it wrote there."""

    nonce: str
    digest: str
    path: str
    file_id: str

    def encode(self) -> bytes:
        return _dumps({"version": VERSION, "nonce": self.nonce, "digest": self.digest,
                       "path": self.path, "file_id": self.file_id})


_CONTROL: dict[str, Check] = {
    "version": _integer(0), "nonce": _HEX, "digest": _HEX, "path": _string(MAX_PATH),
    "file_id": ((lambda v: isinstance(v, str) and bool(_FILE_ID.fullmatch(v))), "a file id")}


def decode_control(data: bytes) -> Control:
    body = _closed(_frame(data, MAX_CONTROL, "control frame"), _CONTROL, "control")
    return Control(body["nonce"], body["digest"], body["path"], body["file_id"])


# The answer's one outcome: launched, refused (kind "broker": a BrokerError; "start": a
# StartError, the command's own) or failed (the launcher's OSError).
_OUTCOMES: dict[str, dict[str, Check]] = {
    "launched": {"pid": _integer(1), "thread_id": _integer(1)},
    "refused": {"kind": ((lambda v: v in ("broker", "start")), "broker or start"),
                "code": _string(64), "message": _string(MAX_MESSAGE)},
    "failed": {"winerror": _integer(0), "message": _string(MAX_MESSAGE)},
}


@dataclass(frozen=True)
class Answer:
    outcome: str  # one of _OUTCOMES
    body: dict[str, Any]

    def encode(self) -> bytes:
        return _dumps({"version": VERSION, "outcome": self.outcome, "body": self.body})


_ANSWER: dict[str, Check] = {"version": _integer(0),
                             "outcome": ((lambda v: v in _OUTCOMES), "an outcome"),
                             "body": _OBJECT}


def decode_answer(data: bytes) -> Answer:
    body = _closed(_frame(data, MAX_ANSWER, "answer"), _ANSWER, "answer")
    outcome = body["outcome"]
    return Answer(outcome, _closed(body["body"], _OUTCOMES[outcome], f"answer.{outcome}"))


def _dumps(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _frame(data: bytes, limit: int, what: str) -> dict:
    """`data` as a JSON object of this protocol's version, read only if within `limit`."""
    if len(data) > limit:
        raise BrokerError("broker_frame_oversized",
                          f"the {what} is {len(data)} bytes, over its bound of {limit}")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise BrokerError("broker_frame_invalid", f"the {what} is not JSON") from None
    if not isinstance(body, dict):
        raise BrokerError("broker_frame_invalid", f"the {what} is not a JSON object")
    if type(body.get("version")) is not int or body["version"] != VERSION:
        raise BrokerError("broker_unknown_version", f"the {what} is not of version {VERSION} "
                          f"(it says {str(body.get('version'))[:16]!r})")
    return body


def _closed(body: dict, shape: dict[str, Check], what: str) -> dict:
    """`body`, having exactly the fields of `shape`, each as it says."""
    unknown = sorted(set(body) - set(shape))
    if unknown:
        raise BrokerError("broker_unknown_field", f"unknown field {what}.{unknown[0][:64]}")
    for name, (holds, kind) in shape.items():
        if name not in body:
            raise BrokerError("broker_frame_invalid", f"{what}.{name} is missing")
        if not holds(body[name]):
            raise BrokerError("broker_frame_invalid", f"{what}.{name} is not {kind}")
    return body
