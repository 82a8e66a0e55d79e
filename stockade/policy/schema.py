"""The document schema: sections, their keys, how each value is checked and converted, and how
it is laid over the base's value (a preset's, or the model's defaults): see `FIELDS`.

Converters and combiners raise `Invalid(message, key)`; the public functions add the file name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, TypeVar

from stockade.policy import domains, paths, reach, units
from stockade.policy.model import (
    CONTAINMENTS,
    GIT_MODES,
    HOME_MODES,
    ISOLATIONS,
    NETWORK_MODES,
    STDIN_MODES,
    UNIX_SOCKET_MODES,
    WORKSPACE_MODES,
    Credential,
    HttpRule,
)
from stockade.policy.render import kind, show

SECTIONS = ("filesystem", "network", "env", "limits", "process")
MAX_CPU = 4096.0
MAX_PIDS = 4194304  # the kernel's largest pid_max
UNLIMITED = "unlimited"  # limits.pids: no limit, where a base (a preset) had one
MIN_MEMORY = 1 << 20  # no program starts in less address space: a smaller limit is a mistake

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

T = TypeVar("T")
Convert = Callable[[object, str], Any]
Combine = Callable[[Any, Any, str], Any]  # (the base's value, the document's, its key)


class Invalid(Exception):
    """A problem at dotted `key`; the public functions turn it into a PolicyError."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


def table(value: object, key: str) -> Mapping[Any, Any]:
    """`value` if it is a table (the whole document when `key` is empty)."""
    if not isinstance(value, Mapping):
        what = "a table" if key else "the policy document to be a table"
        raise Invalid(f"expected {what} (a JSON object), got {kind(value)}", key)
    return value


def check_keys(value: Mapping[Any, Any], known: tuple[str, ...], key: str) -> None:
    """Refuse the first key of `value` not in `known`."""
    for name in value:
        if name not in known:
            raise Invalid(f"unknown key {show(name)} (known: {', '.join(known)})", key)


def sorted_unique(items: Iterable[Any]) -> tuple[Any, ...]:
    """`items` deduplicated and sorted."""
    return tuple(sorted(set(items)))


def _scalar(parse: Callable[[object], T]) -> Callable[[object, str], T]:
    """A converter that reports `parse`'s ValueError at the key."""
    def convert(value: object, key: str) -> T:
        try:
            return parse(value)
        except ValueError as exc:
            raise Invalid(str(exc), key) from None
    return convert


def _list_of(parse: Callable[[object], T]) -> Callable[[object, str], tuple[T, ...]]:
    """A converter for an array of `parse`d items."""
    def convert(value: object, key: str) -> tuple[T, ...]:
        if not isinstance(value, list | tuple):
            raise Invalid(f"expected an array, got {kind(value)}", key)
        return tuple(_scalar(parse)(item, f"{key}[{index}]") for index, item in enumerate(value))
    return convert


def _choice(options: tuple[str, ...]) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if not isinstance(value, str) or value not in options:
            listed = ", ".join(f'"{option}"' for option in options)
            raise ValueError(f"expected one of {listed}, got {show(value)}")
        return value
    return parse


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {show(value)}")
    return value


def _protected_entry(value: object) -> str:
    """A name to protect, or `!NAME`: a name the base protects, no longer protected."""
    name = value[1:] if isinstance(value, str) and value.startswith("!") else value
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name
            or "\0" in name):
        raise ValueError(f'expected a file name such as ".agents" (no "/"), or "!NAME" to stop '
                         f"protecting an inherited one, got {show(value)}")
    if name.casefold() == ".git":
        raise ValueError(f'{show(value)}: .git is not a protected name; filesystem.git says '
                         'how it is protected ("guarded", the default: hooks, config and '
                         'pointers read-only; "read-only": all of it; "writable")')
    return value


def _env_name(value: object) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise ValueError(f'expected a variable name such as "PATH", got {show(value)}')
    return value


def _env_set(value: object, key: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for name, text in table(value, key).items():
        _scalar(_env_name)(name, key)
        if not isinstance(text, str):  # never show the value: it may be a secret
            raise Invalid(f"expected a string value, got {kind(text)}", f"{key}.{name}")
        if "\0" in text:
            raise Invalid("expected a value without NUL bytes", f"{key}.{name}")
        pairs.append((name, text))
    return tuple(pairs)


_CREDENTIAL_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}", re.ASCII)
_HEADER = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", re.ASCII)  # an HTTP token (RFC 9110)
_QUERY_NAME = re.compile(r"[A-Za-z0-9._~-]+", re.ASCII)  # needs no percent-encoding
_METHOD = re.compile(r"[A-Z]+", re.ASCII)
_PATH_PREFIX = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@/-]*", re.ASCII)
_PLACES = ("header", "basic_user", "query")
_SOURCES = ("from_env", "from_file")
_CREDENTIAL_KEYS = ("name", "host", "env", *_PLACES, "prefix", *_SOURCES)


def _text(pattern: re.Pattern[str], example: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"expected {example}, got {show(value)}")
        return value
    return parse


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not all(" " <= c <= "~" for c in value):
        raise ValueError(f'expected printable ASCII such as "Bearer ", got {show(value)}')
    return value


def _basic_user(value: object) -> str:
    if not isinstance(value, str) or ":" in value or not all(" " <= c <= "~" for c in value):
        raise ValueError(f'expected a user name of printable ASCII without ":", got '
                         f"{show(value)}")
    return value


_CREDENTIAL_FIELDS: dict[str, Callable[[object], str]] = {
    "name": _text(_CREDENTIAL_NAME, 'a name of lower-case letters, digits, "-" and "_" such '
                  'as "github" (at most 32)'),
    "host": domains.normalise_pattern,
    "env": _env_name,
    "header": _text(_HEADER, 'a header name such as "Authorization"'),
    "prefix": _prefix,
    "basic_user": _basic_user,
    "query": _text(_QUERY_NAME, 'a query parameter name such as "api_key"'),
    "from_env": _env_name,
    "from_file": paths.tidy_path,
}


def _tables(value: object, key: str) -> list[tuple[str, Mapping[Any, Any]]]:
    """An array of tables, each with its key (`key[index]`)."""
    if not isinstance(value, list | tuple):
        raise Invalid(f"expected an array of tables, got {kind(value)}", key)
    return [(f"{key}[{index}]", table(item, f"{key}[{index}]")) for index, item in enumerate(value)]


def _credentials(value: object, key: str) -> tuple[Credential, ...]:
    """`[[network.credentials]]`: every key known, one place and one source each, names and
    sandbox variables unique (a placeholder stands for one secret)."""
    credentials: list[Credential] = []
    for where, entry in _tables(value, key):
        check_keys(entry, _CREDENTIAL_KEYS, where)
        for required in ("name", "host", "env"):
            if required not in entry:
                raise Invalid(f'missing required key "{required}"', where)
        fields = {name: _scalar(_CREDENTIAL_FIELDS[name])(item, f"{where}.{name}")
                  for name, item in entry.items()}
        for group, what in ((_PLACES, "where the secret goes"), (_SOURCES, "where it comes "
                                                                 "from on the host")):
            given = [name for name in group if name in fields]
            if len(given) != 1:
                raise Invalid(f"expected exactly one of {', '.join(group)} ({what}), got "
                              f"{len(given)}", where)
        if "prefix" in fields and "header" not in fields:
            raise Invalid('prefix needs header (it starts that header\'s value)',
                          f"{where}.prefix")
        credential = Credential(**fields)
        for other in credentials:
            if credential.name == other.name or credential.env == other.env:
                same = "name" if credential.name == other.name else "env"
                raise Invalid(f"{same} {show(getattr(credential, same))} is also another "
                              "credential's", f"{where}.{same}")
        credentials.append(credential)
    return tuple(credentials)


def _http_rules(value: object, key: str) -> tuple[HttpRule, ...]:
    """`[[network.http]]`: a host pattern (one rule each), methods and path prefixes."""
    rules: list[HttpRule] = []
    for where, entry in _tables(value, key):
        check_keys(entry, ("host", "methods", "paths"), where)
        if "host" not in entry:
            raise Invalid('missing required key "host"', where)
        host = _scalar(domains.normalise_pattern)(entry["host"], f"{where}.host")
        if any(rule.host == host for rule in rules):
            raise Invalid(f"{show(host)} has another rule: write one rule per host pattern",
                          f"{where}.host")
        methods = _list_of(_text(_METHOD, 'an upper-case method such as "GET"'))(
            entry.get("methods", []), f"{where}.methods")
        prefixes = _list_of(_text(_PATH_PREFIX, 'a path prefix such as "/repos/org/" (no '
                                  '"%", "?" or "#")'))(entry.get("paths", []), f"{where}.paths")
        for index, prefix in enumerate(prefixes):
            if any(part in (".", "..") for part in prefix.split("/")):
                raise Invalid(f'expected a path prefix without "." or ".." segments, got '
                              f"{show(prefix)}", f"{where}.paths[{index}]")
        rules.append(HttpRule(host, sorted_unique(methods), sorted_unique(prefixes)))
    return tuple(rules)


def _cpu(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number of cores such as 2 or 0.5, got {show(value)}")
    if not (math.isfinite(value) and 0 < value <= MAX_CPU):
        raise ValueError(f"expected a number of cores above 0 and at most {MAX_CPU:g}, "
                         f"got {show(value)}")
    return float(value)


def _memory(value: object) -> int:
    size = units.parse_size(value)
    if size < MIN_MEMORY:
        raise ValueError(f'expected a memory limit of at least "1MiB" (no program starts in '
                         f"less address space), got {show(value)}")
    return size


def _pids(value: object) -> int | None:
    if value == UNLIMITED:  # (a preset's limit lifted: the landlock tier cannot bind root)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_PIDS:
        raise ValueError(f"expected a whole number of processes from 1 to {MAX_PIDS}, or "
                         f'"{UNLIMITED}", got {show(value)}')
    return value


def _add(old: tuple[T, ...], new: tuple[T, ...], key: str) -> tuple[T, ...]:
    return (*old, *new)


def _add_or_remove(old: tuple[str, ...], new: tuple[str, ...], key: str) -> tuple[str, ...]:
    """The base's names and the document's, without those the document lists as `!NAME`
    (matched regardless of case, as names are). Removing a name the base does not protect, or
    adding and removing one, is refused: either is a typo in a security setting."""
    added = {name.casefold() for name in new if not name.startswith("!")}
    names = list(old)
    for index, entry in enumerate(new):
        if not entry.startswith("!"):
            continue
        name = entry[1:].casefold()
        if name in added:
            raise Invalid(f"{show(entry[1:])} is both added and removed", f"{key}[{index}]")
        kept = [n for n in names if n.casefold() != name]
        if len(kept) == len(names):
            raise Invalid(f"{show(entry)} removes a name the base does not protect (it "
                          f"protects: {', '.join(sorted(old)) or 'nothing'})", f"{key}[{index}]")
        names = kept
    return (*names, *(name for name in new if not name.startswith("!")))


def _by_name(old: tuple[tuple[str, str], ...], new: tuple[tuple[str, str], ...],
             key: str) -> tuple[tuple[str, str], ...]:
    return tuple({**dict(old), **dict(new)}.items())


# How a document's value is laid over the base's, in words (docs/policy.md shows it).
MERGE_RULES: dict[Combine | None, str] = {
    None: "replaces the base's",
    _add: "adds to the base's",
    _add_or_remove: 'adds to the base\'s; "!NAME" removes one of the base\'s',
    _by_name: "merges with the base's by variable name",
}


def merge_rule(section: str, key: str) -> str:
    """How the document key `section.key` is laid over the base's value, in words."""
    return MERGE_RULES[FIELDS[section][key][2]]


CONTAIN = _scalar(_choice(CONTAINMENTS))  # the top-level `containment` key
ISOLATE = _scalar(_choice(ISOLATIONS))  # the top-level `isolation` key
SIZE_LIMITS = ("memory", "output", "file_size")  # in bytes, written with a unit
_fs_path = _list_of(partial(paths.tidy_path, optional_allowed=True))
_domains = _list_of(domains.normalise_pattern)
_reach = _list_of(reach.normalise_reach)

# section -> document key -> (model attribute, converter, combine with the base's value; None:
# the document's value replaces it). Denials only add: a preset's are never dropped by accident.
FIELDS: dict[str, dict[str, tuple[str, Convert, Combine | None]]] = {
    "filesystem": {
        "read": ("read", _fs_path, None),
        "write": ("write", _fs_path, None),
        "deny": ("deny", _fs_path, _add),
        "protected": ("protected", _list_of(_protected_entry), _add_or_remove),
        "git": ("git", _scalar(_choice(GIT_MODES)), None),
        "home": ("home", _scalar(_choice(HOME_MODES)), None),
        "exec_from_write": ("exec_from_write", _scalar(_bool), None),
        "workspace": ("workspace", _scalar(_choice(WORKSPACE_MODES)), None),
    },
    "network": {
        "mode": ("mode", _scalar(_choice(NETWORK_MODES)), None),
        "allow": ("allow", _domains, None),
        "deny": ("deny", _domains, _add),
        "reach": ("reach", _reach, None),
        "unix_sockets": ("unix_sockets", _scalar(_choice(UNIX_SOCKET_MODES)), None),
        "credentials": ("credentials", _credentials, None),
        "http": ("http", _http_rules, None),
    },
    "env": {
        "pass": ("passthrough", _list_of(_env_name), None),
        "set": ("set", _env_set, _by_name),
    },
    "limits": {
        "timeout": ("timeout", _scalar(units.parse_duration), None),
        "memory": ("memory", _scalar(_memory), None),
        "cpu": ("cpu", _scalar(_cpu), None),
        "pids": ("pids", _scalar(_pids), None),
        "output": ("output", _scalar(units.parse_size), None),
        "file_size": ("file_size", _scalar(units.parse_size), None),
    },
    "process": {
        "cwd": ("cwd", _scalar(paths.tidy_path), None),
        "stdin": ("stdin", _scalar(_choice(STDIN_MODES)), None),
    },
}
