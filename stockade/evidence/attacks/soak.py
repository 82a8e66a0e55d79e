"""One of many concurrent launches: leave a token in our own workspace and try to read the
tokens of the other launches' workspaces (the paths given): reading one is an escape."""

from _common import ARGS, attempt, note, read, write

token, others = ARGS[0], ARGS[1:]
write("token", token.encode())
note("token", token)
for path in others:
    attempt(f"read {path}", lambda p=path: read(p))
