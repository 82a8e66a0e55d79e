"""Text shown on a terminal that may hold what a sandboxed command chose (a name, a link's
text, a file's contents), with every character that is not plainly visible escaped: the C0
controls, DEL and the C1 controls as `\\xNN` (ESC is `\\x1b`, CR `\\x0d`), a byte of a name or
text that is not UTF-8 as `\\xNN` too, and the invisible, blank or reordering Unicode
characters as `\\uNNNN` (`\\xNN` below U+0100): format characters (zero-width ones, bidi
controls such as U+202E and U+2066), line and paragraph separators, every space but U+0020,
and the letters and marks that render as nothing (the Hangul fillers U+115F, U+1160, U+3164
and U+FFA0, U+034F, the variation selectors) — a name holding one looks like a name without
it. Used by the review (lifecycle.changeview), the violations' details and every
StockadeError's message; it imports nothing of Stockade's, so the lowest layer may use it.
"""

from __future__ import annotations

import re
import unicodedata

# What a terminal reads as "attributes back to normal", written before Stockade's own lines
# where the command's output came before them (colours it left set, black on black, would
# hide them: issue 34, D4).
RESET = "\x1b[0m"
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})  # (Zs: but U+0020)
# Letters and marks that render as nothing or as blank: Unicode's Default_Ignorable_Code_Point
# outside the categories above (the combining grapheme joiner, the Hangul fillers, Khmer's
# inherent vowels, the Mongolian and other variation selectors), and the blank Braille
# pattern.
_BLANK = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f"
                    "\uffa0\U000e0100-\U000e01ef]")


def visible(text: str, *, tabs: bool = False, escaped: bool = True) -> str:
    """`text` with every character that is not plainly visible escaped (see above); tabs
    kept when `tabs`; as it is when not `escaped` (the `review_escape` weakening of the
    evidence matrix's tests, never in production)."""
    if not escaped or text.isprintable() and (tabs or "\t" not in text) and \
            not _BLANK.search(text):
        return text
    return "".join(_escaped(c) if _hidden(c) and not (tabs and c == "\t") else c
                   for c in text)


def _hidden(char: str) -> bool:
    return char != " " and (unicodedata.category(char) in _HIDDEN or bool(_BLANK.match(char)))


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # (a byte that was not UTF-8, as os.fsdecode keeps it)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
