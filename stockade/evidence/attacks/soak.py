"""One of many concurrent launches: read the token the host left in our own workspace, and try
to read the tokens of the other launches' workspaces (the paths given): reading one is an
escape."""

from _common import ARGS, attempt, note, read

note("token", read("token").decode())
for path in ARGS:
    attempt(f"read {path}", lambda p=path: read(p))
