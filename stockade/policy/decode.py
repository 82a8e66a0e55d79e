"""Policy files to documents: read (bounded, UTF-8) and decode TOML or JSON by the file's suffix.

JSON is held to TOML's standards: duplicate keys and NaN/Infinity are errors.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from stockade.errors import PolicyError
from stockade.policy.render import show

MAX_FILE_BYTES = 1 << 20


def load_document(name: str) -> Any:
    """The decoded document in file `name`; PolicyError (naming the file) on any failure."""
    suffix = os.path.splitext(name)[1].lower()
    if suffix not in (".toml", ".json"):
        raise PolicyError("expected a policy file name ending in .toml or .json", file=name)
    text = _read_text(name)
    return _decode_toml(text, name) if suffix == ".toml" else _decode_json(text, name)


def _read_text(name: str) -> str:
    try:
        # Opened without blocking and read only if regular: a FIFO would wait for a writer
        # for ever, a device give endless data.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        with open(os.open(name, flags), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device"  # (a directory: EISDIR)
                raise PolicyError(f"cannot read policy file (it is {kind}, not a regular "
                                  "file)", file=name)
            data = handle.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "invalid path"
        raise PolicyError(f"cannot read policy file ({reason})", file=name) from None
    if len(data) > MAX_FILE_BYTES:
        raise PolicyError(f"policy file is larger than {MAX_FILE_BYTES} bytes", file=name)
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"policy file is not valid UTF-8 (at byte {exc.start})",
                          file=name) from None


def _decode_toml(text: str, name: str) -> dict[str, Any]:
    import tomllib  # (here: ≈ 3 ms of every CLI run that reads no TOML)

    try:
        return tomllib.loads(text)
    except RecursionError:
        raise PolicyError("invalid TOML: nested too deeply", file=name) from None
    except ValueError as exc:  # TOMLDecodeError, or an integer too long to convert
        raise PolicyError(f"invalid TOML: {exc}", file=name) from None


def _decode_json(text: str, name: str) -> object:
    try:
        return json.loads(text, object_pairs_hook=_json_object, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"invalid JSON: {exc.msg} (at line {exc.lineno}, column {exc.colno})",
                          file=name) from None
    except RecursionError:
        raise PolicyError("invalid JSON: nested too deeply", file=name) from None
    except ValueError as exc:  # from the hooks, or an integer too long to convert
        raise PolicyError(f"invalid JSON: {exc}", file=name) from None


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, value in pairs:
        if key in table:
            raise ValueError(f"duplicate key {show(key)}")
        table[key] = value
    return table


def _json_constant(name: str) -> float:
    raise ValueError(f"{name} is not a valid number here")
