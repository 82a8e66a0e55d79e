"""LaunchRequest: the closed, typed, versioned description of one launch.

Every backend consumes this, never an argv string: a Windows launch needs typed stdio, limits and
roots, not a command line. The digest is SHA-256 over a canonical encoding of everything that
changes what runs; the request id is fresh per launch and therefore not part of the digest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from stockade.errors import RequestError
from stockade.policy.model import CONTAINMENTS, GIT_MODES, ISOLATIONS, WORKSPACE_MODES, HttpRule

REQUEST_VERSION = 1
MAX_FRAME = 1 << 20  # bytes; a serialised request larger than this is rejected


@dataclass(frozen=True)
class PathGrant:
    """One root. `path` is canonical (symlinks resolved); `alias` is as the policy wrote it."""

    path: str
    alias: str


@dataclass(frozen=True)
class CredentialSpec:
    """A `network.credentials` entry, compiled: `placeholder` is this launch's own text for the
    secret (in the command's variable `env`), `from_file` an absolute path. The secret itself
    is read by the backend at launch and is never in a request."""

    name: str
    host: str
    env: str
    placeholder: str
    header: str = ""
    prefix: str = ""
    basic_user: str = ""
    query: str = ""
    from_env: str = ""
    from_file: str = ""


@dataclass(frozen=True)
class NetworkSpec:
    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    reach: tuple[str, ...] = ()
    unix_sockets: str = "own"  # (see stockade.policy.model.UNIX_SOCKET_MODES)
    credentials: tuple[CredentialSpec, ...] = ()
    http: tuple[HttpRule, ...] = ()


@dataclass(frozen=True)
class LimitSpec:
    timeout: float | None = None
    memory: int | None = None
    cpu: float | None = None
    pids: int | None = None
    output: int | None = None
    file_size: int | None = None


@dataclass(frozen=True)
class LaunchRequest:
    argv: tuple[str, ...]
    cwd: str
    env: tuple[tuple[str, str], ...]
    read: tuple[PathGrant, ...] = ()
    write: tuple[PathGrant, ...] = ()
    deny: tuple[PathGrant, ...] = ()
    # Every place Stockade's own state may be, resolved; those that exist are among the denied
    # paths (masked whatever the policy says)
    stockade_state: tuple[str, ...] = ()
    # The code the host runs next (Stockade's install, the interpreter, its import path) that
    # lies in a write root, resolved: read-only in the view (launch/hostcode.py)
    host_code: tuple[str, ...] = ()
    host_code_kinds: tuple[str, ...] = ()  # (what each of host_code is: hostcode.KINDS)
    # What of the home makes host programs run code (policy.model.HOME_CODE) and lies in a
    # write root, resolved (launch/homecode.py): read-only in the view (`home_code`)
    home_code: tuple[str, ...] = ()
    # Names in write roots the command may not make, each "directory/name" (namewatch.c): the
    # home's code not there yet (homecode.py), and what an import would take before a kept
    # module of the host's, or its missing bytecode cache (hostcode.shadowing)
    unmade: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()  # names read-only whole (a `.git` among them too)
    git: str = "guarded"  # how every other `.git` is protected (policy.model.GIT_MODES)
    exec_from_write: bool = False
    # "overlay": each write root is an overlay whose upper layer lies in `changes_dir`, the
    # launch's change set in the state directory (stockade/lifecycle/changes.py).
    workspace: str = "direct"
    network: NetworkSpec = field(default_factory=NetworkSpec)
    limits: LimitSpec = field(default_factory=LimitSpec)
    stdin: str = "null"
    containment: str = "native"  # what holds the sandbox (policy.model.CONTAINMENTS)
    isolation: str = "namespaces"  # (see stockade.policy.model.ISOLATIONS)
    request_id: str = field(default_factory=lambda: os.urandom(16).hex())
    # Where this launch's overlay layers are (one launch's own, like its id: not digested).
    changes_dir: str = ""
    version: int = REQUEST_VERSION

    def canonical(self) -> bytes:
        """The canonical encoding of what runs (everything but the request id and where
        an overlay launch keeps its layers, which are each launch's own)."""
        body = dict(self._body)
        del body["request_id"]
        del body["changes_dir"]
        return _dumps(body)

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def encode(self, **replaced: object) -> bytes:
        """The encoding, with the top-level fields in `replaced` (as JSON-ready values)
        standing in for this request's own."""
        return _dumps(self._body | replaced)

    @functools.cached_property
    def _body(self) -> dict[str, Any]:
        # (made once: a launch encodes its request, its digest and its view frame from it)
        return _plain(self)

    @classmethod
    def decode(cls, data: bytes) -> LaunchRequest:
        if len(data) > MAX_FRAME:
            raise RequestError(f"request of {len(data)} bytes exceeds the {MAX_FRAME}-byte bound")
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"request is not valid JSON: {exc.__class__.__name__}") from None
        if not isinstance(body, dict):
            raise RequestError("request is not an object")
        if body.get("version") != REQUEST_VERSION:
            raise RequestError(f"unsupported request version (expected {REQUEST_VERSION})")
        try:
            return _build(cls, body)
        except (TypeError, ValueError) as exc:
            raise RequestError(str(exc)) from None


def _plain(value: object) -> Any:
    """`value` as JSON-ready data: what dataclasses.asdict gives, with lists for tuples, but
    without its deep copies (this runs on every launch)."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    kind = type(value)
    if kind in _FIELDS:
        return {name: _plain(getattr(value, name)) for name in _FIELDS[kind]}
    return value


def _dumps(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


_NESTED = {"network": NetworkSpec, "limits": LimitSpec}
_FIELDS = {kind: tuple(f.name for f in fields(kind))
           for kind in (LaunchRequest, PathGrant, NetworkSpec, LimitSpec, CredentialSpec,
                        HttpRule)}
_NETWORK_ITEMS = {"credentials": CredentialSpec, "http": HttpRule}


def _build(cls: type, body: dict) -> LaunchRequest:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"unknown request field {unknown[0]!r}")
    missing = sorted(f.name for f in fields(cls) if f.name not in body)
    if missing:
        raise ValueError(f"missing request field {missing[0]!r}")
    values = {}
    for name, value in body.items():
        if name in _NESTED:
            values[name] = _build_flat(_NESTED[name], value, name)
        elif name in ("read", "write", "deny"):
            values[name] = tuple(_build_flat(PathGrant, item, name) for item in _list(value, name))
        elif name == "env":
            values[name] = tuple(_pair(item) for item in _list(value, name))
        elif name in ("argv", "protected", "stockade_state", "host_code", "host_code_kinds",
                      "home_code",
                      "unmade"):
            values[name] = tuple(_string(item, name) for item in _list(value, name))
        elif name in ("allow", "deny"):
            values[name] = tuple(value)
        else:
            values[name] = value
    request = cls(**values)
    _check_types(request)
    return request


def _build_flat(cls: type, value: object, where: str):
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"unknown field {where}.{unknown[0]}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    if cls is NetworkSpec:
        for name, kind in _NETWORK_ITEMS.items():
            if name in values:
                values[name] = tuple(_build_flat(kind, item, f"{where}.{name}")
                                     for item in values[name])
    return cls(**values)


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} items must be strings")
    return value


def _pair(item: object) -> tuple[str, str]:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
        raise ValueError("env items must be [name, value] string pairs")
    return (item[0], item[1])


def _check_types(request: LaunchRequest) -> None:
    if not request.argv:
        raise ValueError("argv is empty")
    if not isinstance(request.cwd, str) or not isinstance(request.request_id, str):
        raise ValueError("cwd and request_id must be strings")
    if not isinstance(request.exec_from_write, bool):
        raise ValueError("exec_from_write must be a boolean")
    if request.isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
    if request.git not in GIT_MODES:
        raise ValueError(f"git must be one of {', '.join(GIT_MODES)}")
    if request.workspace not in WORKSPACE_MODES:
        raise ValueError(f"workspace must be one of {', '.join(WORKSPACE_MODES)}")
    if not isinstance(request.changes_dir, str):
        raise ValueError("changes_dir must be a string")
    if request.containment not in CONTAINMENTS:
        raise ValueError(f"containment must be one of {', '.join(CONTAINMENTS)}")
    if list(request.env) != sorted(request.env):
        raise ValueError("env must be sorted")
