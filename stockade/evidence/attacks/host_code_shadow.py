"""Make each name given, beside a module file the host's program imported from a write root,
that its next import of the module takes first (a package directory of the module's name, an
extension module, the missing bytecode cache directory): by mkdir, open with O_CREAT, symlink,
and rename of a package made beside it (which, made, stays). Any call that succeeds, or leaves
the name behind, is an escape: the host's program would run what the command put there.
"""

import os
import shutil

from _common import ARGS, attempt, write


def made(path, call, last):
    """Run `call`; the name existing afterwards is an escape even if the call said no (taken
    away again but after the `last` call, so that the next one tries afresh)."""
    try:
        call()
    finally:
        if os.path.lexists(path):
            if not last:
                taken_away(path)
            raise AssertionError  # (reported below, never as a denial)
    return f"made {path}"


def taken_away(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def renamed_onto(path):
    """A package made beside `path` (which the command may do), renamed onto it."""
    package = os.path.join(os.path.dirname(path), "prepared")
    os.mkdir(package)
    write(os.path.join(package, "__init__.py"), b"raise SystemExit('planted')\n")
    try:
        os.rename(package, path)
    finally:
        if os.path.isdir(package):
            taken_away(package)


def actions(path):
    yield "mkdir", lambda: os.mkdir(path)
    yield "open", lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    yield "symlink", lambda: os.symlink("prepared", path)
    yield "rename", lambda: renamed_onto(path)


for target in ARGS:
    calls = list(actions(target))
    for how, action in calls:
        last = how == calls[-1][0]
        try:
            attempt(f"{how} {target}",
                    lambda target=target, action=action, last=last: made(target, action, last))
        except AssertionError:
            print(f"{how} {target}: ALLOWED the name exists", flush=True)
