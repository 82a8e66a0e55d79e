"""With stdout appended to a host file: truncate it, then write past the output limit (argv:
how many bytes). Truncating is an escape; what is written beyond the limit must not land."""

import os

from _common import ARGS, attempt, note

attempt("truncate the caller's stdout file", lambda: os.ftruncate(1, 0))
total = int(ARGS[0])
chunk = b"x" * 65536
written = 0
while written < total:
    try:
        written += os.write(1, chunk[:total - written])
    except OSError:
        break
note("wrote", str(written))
