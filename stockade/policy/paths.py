"""Policy paths: checked and tidied here, expanded and resolved only at compile time.

A path is absolute; or starts with a placeholder (`{workspace}`, `{tmp}`, `{home}`) followed by
the end or `/`; or starts with `~` (short for `{home}`); or is relative to `{workspace}`. A leading
`?` marks a filesystem root as optional: compile skips it where it does not exist.

Tidying drops empty and `.` components and writes `~` as `{home}`. `..` is kept, for compile to
resolve against the real tree, but a `..` that climbs above a path's start is refused. `lexical_key`
is the `..`-applied form, used only to spot ambiguous entries; it is never authorisation evidence.
"""

from __future__ import annotations

import os

from stockade.policy.render import show

PLACEHOLDERS = ("{workspace}", "{tmp}", "{home}")
OPTIONAL = "?"
MAX_PATH = 4096


def tidy_path(value: object, *, optional_allowed: bool = False) -> str:
    """The tidied form of a policy path (a str or os.PathLike); ValueError naming the problem
    if invalid."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f'expected a path such as "/usr" or "{{workspace}}/src", '
                         f"got {show(value)}")
    if "\0" in value:
        raise ValueError("expected a path without NUL bytes")
    optional = optional_allowed and value.startswith(OPTIONAL)
    text = value[1:] if optional else value
    root, rest = _split_root(text, value)
    if "{" in rest or "}" in rest:
        raise ValueError(f"placeholders may only start a path, got {show(value)}")
    parts = [part for part in rest.split("/") if part not in ("", ".")]
    _resolve(root, parts, value)
    if root == "/":
        tidied = "/" + "/".join(parts)
    elif root:
        tidied = "/".join([root, *parts])
    elif not parts:
        tidied = "."
    else:
        tidied = "/".join(parts)
        if tidied.startswith(("~", OPTIONAL)):
            tidied = "./" + tidied
    if optional:
        tidied = OPTIONAL + tidied
    if len(tidied) > MAX_PATH:
        raise ValueError(f"expected a path of at most {MAX_PATH} characters")
    return tidied


def lexical_key(path: str) -> tuple[str, ...]:
    """`(root, *components)` of a tidied path, `..` applied, relative paths under {workspace}."""
    text = path.removeprefix(OPTIONAL)
    root, rest = _split_root(text, path)
    return (root or "{workspace}", *_resolve(root, rest.split("/"), path))


def is_within(inner: tuple[str, ...], outer: tuple[str, ...]) -> bool:
    """Whether lexical key `inner` is `outer` or below it."""
    return inner[: len(outer)] == outer


def _split_root(text: str, original: str) -> tuple[str, str]:
    if text.startswith("/"):
        return "/", text
    if text.startswith("{"):
        for placeholder in PLACEHOLDERS:
            if text == placeholder or text.startswith(placeholder + "/"):
                return placeholder, text[len(placeholder):]
            if text.startswith(placeholder):
                raise ValueError(f'a placeholder must end the path or be followed by "/", '
                                 f"got {show(original)}")
        name, brace, _ = text.partition("}")
        known = ", ".join(PLACEHOLDERS)
        raise ValueError(f"unknown placeholder {show(name + brace)} (known: {known})")
    if text == "~" or text.startswith("~/"):
        return "{home}", text[1:]
    if text.startswith("~"):
        raise ValueError(f'"~user" paths are not supported, got {show(original)}')
    return "", text


def _resolve(root: str, parts: list[str], original: str) -> list[str]:
    resolved: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part != "..":
            resolved.append(part)
        elif resolved:
            resolved.pop()
        elif root == "":
            raise ValueError(f"relative path escapes the workspace, got {show(original)}")
        elif root != "/":
            raise ValueError(f"path escapes {root}, got {show(original)}")
    return resolved
