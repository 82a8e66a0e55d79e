"""Which program image runs: the command's (`executable`, for the launch: the host checks it
before anything is set up, and the broker derives it again from the request it authorized),
and Python's own (`interpreter`: what runs the readiness probe's child and the broker)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from stockade.errors import StartError
from stockade.launch.request import LaunchRequest
from stockade.windows import admission, cmdline, fsinfo


def executable(request: LaunchRequest, is_file: Callable[[str], bool] = os.path.isfile,
               entry: Callable[[str], admission.Entry] = fsinfo.entry,
               link_target: Callable[[str], str | None] = fsinfo.app_link_target) -> str:
    """The program to run, which must lie in a root the sandbox may execute from. An app
    execution alias (the Store's `WindowsApps\\python.exe`) is run as the program it names:
    what CreateProcessW does with an alias (activating the app under its package's identity)
    is not documented for a child created in an AppContainer and a Job, so an alias is never
    the image itself, and its target must lie in a root like any program."""
    path = cmdline.resolve_program(request.argv[0], request.cwd, request.env, is_file)
    if admission.app_alias(entry(path)):
        target = link_target(path)
        if target is None:
            raise StartError("command_not_found", f"{request.argv[0]}: {path} is an app "
                             "execution alias whose program could not be read; name the "
                             "program itself")
        path = target
    roots = request.read + (request.write if request.exec_from_write else ())
    if not any(admission.inside(path, g.path) for g in roots):
        raise StartError("command_not_found", f"{request.argv[0]}: {path} is outside every "
                         "root the sandbox may execute from")
    return path


def interpreter() -> str:
    """This Python's program itself: a venv's base interpreter (a venv's `python.exe` is a
    launcher that starts it as another process), and for the Store's Python, an app execution
    alias in a folder of aliases that no root may hold (admission.py), the program it names."""
    python = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    if admission.app_alias(fsinfo.entry(python)):
        return fsinfo.app_link_target(python) or python
    return python
