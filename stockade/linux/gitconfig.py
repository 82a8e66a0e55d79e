"""A git configuration file's entries, read as git reads them (its config.c parser).

Stockade reads a repository's own configuration only for what makes git read another file or
look for hooks elsewhere (see gitdirs.py). A file git cannot parse, git refuses to use, so no
configuration in it can take effect; `entries` refuses it too (ValueError, with the line),
rather than read it differently from git.
"""

from __future__ import annotations

# (section, subsection, key, value): section and key lowercased, as git compares them; the
# subsection as written; a key without `=` has the value None (git's boolean true).
Entry = tuple[str, str | None, str, str | None]

_SPACE = " \t\r\n"  # git's isspace()
_ESCAPES = {"t": "\t", "b": "\b", "n": "\n", "\\": "\\", '"': '"'}


def entries(text: str) -> list[Entry]:
    """Every entry of a configuration file's `text`, in order."""
    reader = _Reader(text.removeprefix("\ufeff").replace("\r\n", "\n"))
    found: list[Entry] = []
    section: tuple[str, str | None] = ("", None)  # (git takes keys before any section too)
    comment = False
    while True:
        c = reader.next()
        if not c:
            return found
        if c == "\n":
            comment = False
        elif comment or c in _SPACE:
            continue
        elif c in "#;":
            comment = True
        elif c == "[":
            section = _header(reader)
        elif _alpha(c):
            found.append((*section, *_entry(reader, c)))
        else:
            raise reader.error(f"unexpected {c!r}")


def truth(value: str | None) -> bool:
    """Whether git reads `value` as true; anything but a plain false counts (this is only asked
    for what widens what git reads, so a doubtful value errs that way)."""
    return value is None or value.strip().lower() not in ("false", "no", "off", "0", "")


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.at, self.line = text, 0, 1

    def next(self) -> str:
        """The next character, "" at the end."""
        if self.at >= len(self.text):
            return ""
        c = self.text[self.at]
        self.at += 1
        self.line += c == "\n"
        return c

    def error(self, why: str) -> ValueError:
        return ValueError(f"line {self.line}: {why}")


def _alpha(c: str) -> bool:
    return c.isascii() and c.isalpha()


def _key_char(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


def _header(reader: _Reader) -> tuple[str, str | None]:
    """`[section]`, `[section "subsection"]` or the old `[section.subsection]`, after `[`."""
    name = ""
    while True:
        c = reader.next()
        if c == "]":
            section, _, sub = name.lower().partition(".")
            return section, sub if "." in name else None
        if c in (" ", "\t"):
            return name.lower(), _subsection(reader)
        if not (_key_char(c) or c == "."):
            raise reader.error("a bad section header")
        name += c


def _subsection(reader: _Reader) -> str:
    c = reader.next()
    while c in (" ", "\t"):
        c = reader.next()
    if c != '"':
        raise reader.error("a bad section header")
    sub = ""
    while (c := reader.next()) != '"':
        if c == "\\":
            c = reader.next()
        if c in ("", "\n"):
            raise reader.error("an unterminated subsection")
        sub += c
    if reader.next() != "]":
        raise reader.error("a bad section header")
    return sub


def _entry(reader: _Reader, first: str) -> tuple[str, str | None]:
    name = first
    c = reader.next()
    while _key_char(c):
        name += c
        c = reader.next()
    while c in (" ", "\t"):
        c = reader.next()
    if c in ("", "\n"):
        return name.lower(), None
    if c != "=":
        raise reader.error(f"a bad key {name!r}")
    return name.lower(), _value(reader)


def _value(reader: _Reader) -> str:
    """After `=`: up to the end of the line (or of the last continued one). Unquoted
    whitespace runs count one space each, leading and trailing ones none; `;` and `#` start a
    comment outside quotes."""
    value, quoted, comment, spaces = "", False, False, 0
    while True:
        c = reader.next()
        if c in ("", "\n"):
            if quoted:
                raise reader.error("an unterminated quote")
            return value
        if comment:
            continue
        if c in _SPACE and not quoted:
            spaces += bool(value)
            continue
        if c in "#;" and not quoted:
            comment = True
            continue
        value, spaces = value + " " * spaces, 0
        if c == "\\":
            c = reader.next()
            if c in ("", "\n"):
                continue  # a continued line
            if c not in _ESCAPES:
                raise reader.error(f"a bad escape \\{c}")
            value += _ESCAPES[c]
        elif c == '"':
            quoted = not quoted
        else:
            value += c
