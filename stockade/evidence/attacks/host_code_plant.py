"""Make each directory given, missing (one a .pth file in the host's site-packages names), with
a `stockade` package in it, which the host's next `python -m stockade` there would import
before its own: any success is an escape.
"""

import os

from _common import ARGS, attempt, write


def plant(directory):
    os.makedirs(os.path.join(directory, "stockade"))
    write(os.path.join(directory, "stockade", "__init__.py"), b"raise SystemExit('planted')\n")
    return "planted"


for target in ARGS:
    attempt(f"plant {target}/stockade", lambda target=target: plant(target))
