"""Read each file given, or list each directory given: any content reaching the child is an
escape (an empty answer, such as a mask's, reveals nothing)."""

from _common import ARGS, attempt, reveal

for path in ARGS:
    attempt(f"reveal {path}", lambda p=path: reveal(p))
