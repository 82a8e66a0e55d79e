"""How the changes of an overlaid run are shown (`stockade changes`, `ChangeSet.diff()`):
one line per change, and a unified diff of text files, from the one scan `apply` acts on
(changescan.scan).

Everything shown came from the sandboxed command, names and contents alike, and a terminal
acts on control characters: a carriage return or an escape sequence could erase a line on
screen that `apply` would still land. So every character that is not plainly visible is
shown escaped (stockade.visibletext). Only the newline that ends a line, and a tab inside a
text line, are left as they are.
"""

from __future__ import annotations

import difflib
import os

from stockade.lifecycle.changescan import Change, read_regular
from stockade.visibletext import visible

DIFF_LIMIT = 1 << 20  # bytes: a larger file's diff is not shown, only that it changed


def notable_mode(change: Change) -> bool:
    """Whether `change` adds a file or directory whose mode deserves a look, and so is shown:
    a file that can be executed, or either that the group or other users may write (a
    set-user-id or set-group-id bit never lands: changescan.landed). Any other added entry's
    mode is not shown, as git shows none for an ordinary new file."""
    if change.kind != "added" or change.mode < 0:
        return False
    return bool(change.mode & {"file": 0o111 | 0o022, "dir": 0o022}.get(change.type, 0))


def line(change: Change, *, escaped: bool = True) -> str:
    """One line for `change`: its kind, its path, and what else it is."""
    slash = "/" if change.type == "dir" else ""
    kind = {"unshown": "?"}.get(change.kind, change.kind[0].upper())
    return f"{kind} {visible(change.path, escaped=escaped)}{slash}{_details(change)}"


def _details(change: Change) -> str:
    said = []
    if change.kind == "modified" and change.mode >= 0 and change.was_mode >= 0 and \
            change.mode != change.was_mode:
        said.append(f"mode {change.was_mode:o} -> {change.mode:o}")
    if notable_mode(change):
        said.append(f"mode {change.mode:o}")
    if change.note:
        said.append(change.note if change.kind != "unshown"
                    else f"not shown: {change.note}; apply refuses it")
    return f" ({'; '.join(said)})" if said else ""


def diff(change: Change, *, escaped: bool = True) -> str:
    """A unified diff of `change` (text), or one line saying how it changed."""
    old = None if change.kind == "added" else change.path
    new = None if change.kind == "deleted" else change.upper
    rel = visible(change.rel or ".", escaped=escaped)
    a, b = f"a/{rel}", f"b/{rel}"
    if change.kind == "unshown" or change.type not in ("file", "symlink"):
        return f"{line(change, escaped=escaped)}\n"
    header = ""
    if change.kind == "modified" and change.was_mode != change.mode:
        header = f"old mode {change.was_mode:o}\nnew mode {change.mode:o}\n"
    elif notable_mode(change):
        header = f"new file mode {change.mode:o}\n"
    if change.type == "symlink":
        lines = [f"--- {a if old else '/dev/null'}\n", f"+++ {b if new else '/dev/null'}\n"]
        lines += [f"-> {visible(_link(old))}\n"] if old and os.path.islink(old) else []
        lines += [f"+> {visible(_link(new))}\n"] if new else []
        return header + "".join(lines)
    old_text, new_text = _text(old, escaped), _text(new, escaped)
    if old_text is None or new_text is None:
        return (f"{header}Binary files {a if old else '/dev/null'} and "
                f"{b if new else '/dev/null'} differ\n")
    body = "".join(difflib.unified_diff(old_text, new_text, a if old else "/dev/null",
                                        b if new else "/dev/null"))
    return header + body


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _text(path: str | None, escaped: bool) -> list[str] | None:
    """The lines of the regular file at `path` ([] for none), escaped, or None when it is
    not text or cannot be read (never a fifo or device opened: changescan.read_regular)."""
    if path is None:
        return []
    try:
        with read_regular(path) as f:
            data = f.read(DIFF_LIMIT + 1)
    except FileNotFoundError:
        return []
    except OSError:
        return None
    if len(data) > DIFF_LIMIT or b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Lines end at a newline only (str.splitlines would also end one at a CR, a form feed or
    # U+2028, which the escaping must show instead).
    lines = [visible(part, tabs=True, escaped=escaped) + "\n" for part in text.split("\n")]
    if text.endswith("\n") or not text:
        lines.pop()
    else:
        lines[-1] += "\\ No newline at end of file\n"
    return lines
