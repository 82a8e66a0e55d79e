"""What of the host's home directory makes a host program run code, kept from a command whose
write roots hold it (issue 29 A2: the home as the workspace).

A home a write root holds (or is) keeps every top-level hidden entry: host programs find
their start-up files, configuration, plug-ins, package caches and programs there under more
names than any list holds (issue 29 M3). Each that exists is made read-only in the view
(`readonly`: a mount on it, which rename and unlink meet as EBUSY), and no new one can be
made: the home's "directory/.*" entry in `watched` (pid 1 refuses making a name that starts
with "." there, namewatch.c, whatever the call). Elsewhere, policy.model.HOME_CODE names the
rest (~/bin, ~/go) and, for a write root inside a hidden entry (`--write ~/.config`) or
$XDG_CONFIG_HOME and $XDG_DATA_HOME set elsewhere, what below it runs code: each that exists
below a write root is read-only; one that does not is a name the command may not make
(`watched`, "directory/name"), or, when directories on its way are missing too, the first
of them is (nothing is made in the home: every watched directory exists, pinned by the view,
and a tool's empty directory would read as "installed"). A symbolic link on the way is kept
as a name the command may not make again (it may delete it, not point it elsewhere), and
what it leads to is kept the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stockade.errors import UnenforceableError
from stockade.lifecycle import aliases, statedir
from stockade.policy.model import HOME_CODE, XDG_CODE

_HOPS = 40  # (symbolic links followed on one path, as the kernel's limit)
HIDDEN = ".*"  # (a watched entry's name: every name starting with "." but "." and "..")


@dataclass
class HomeCode:
    readonly: set[str] = field(default_factory=set)
    watched: set[str] = field(default_factory=set)


def homes(home: str) -> list[str]:
    """This user's homes: `home` ($HOME) and the password database's, each as named and
    resolved (write roots are resolved: a home reached through a link, `/home -> /data/home`,
    is the home still, issue 29 L2)."""
    named = [os.path.normpath(h) for h in (home, statedir.passwd_home()) if os.path.isabs(h)]
    return sorted({*named, *map(os.path.realpath, named)})


def places(home: str, host_env: Mapping[str, str]) -> list[str]:
    """Every HOME_CODE path of this user: in each of its homes, and what of it lies in
    $XDG_CONFIG_HOME and $XDG_DATA_HOME."""
    found = [os.path.join(h, name) for h in homes(home) for name in HOME_CODE]
    for variable, names in XDG_CODE.items():
        top = host_env.get(variable, "")
        if os.path.isabs(top):
            found += [os.path.join(os.path.normpath(top), name) for name in names]
    return found


def keep(paths: Iterable[str], roots: list[str], held: Iterable[str] = ()) -> HomeCode:
    """What of `paths` (absolute) and of the homes among `held` that a write root holds the
    view keeps from a command writing the `roots`, under each name a root shows it by
    (aliases.py: the home bind-mounted at a second path, issue 29 B1)."""
    found = HomeCode()
    mounts = aliases.table()
    whole = [name for home in map(os.path.normpath, held) for name in _seen(home, roots, mounts)
             if any(_within(name, root) for root in roots)]
    for home in whole:
        found.watched.add(os.path.join(home, HIDDEN))
        for name in _hidden(home):
            _keep(os.path.join(home, name), roots, found, 0, mounts)
    for path in map(os.path.normpath, paths):
        for name in _seen(path, roots, mounts):
            if not _kept_whole(name, whole, roots):
                _keep(name, roots, found, 0, mounts)
    return found


def _seen(path: str, roots: list[str], mounts: aliases.Mounts) -> list[str]:
    """`path`, and each other name a write root shows it by."""
    return list(dict.fromkeys([path, *(name for root in roots
                                       for name in aliases.within(root, path, mounts))]))


def _kept_whole(path: str, whole: list[str], roots: list[str]) -> bool:
    """Whether `path` lies in a hidden entry of a home kept whole, and in no write root granted
    inside one (`--write ~/.config` beside the home: HOME_CODE is kept in it as ever)."""
    for home in whole:
        hidden = os.path.join(home, ".")
        if path.startswith(hidden):
            return not any(root.startswith(hidden) and _within(path, root) for root in roots)
    return False


def _within(path: str, root: str) -> bool:
    return path == os.path.normpath(root) or path.startswith(root.rstrip("/") + "/")


def _hidden(home: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(home) if name.startswith("."))
    except OSError as exc:
        raise UnenforceableError(
            "filesystem.host_code",
            f"the home directory {home} lies in a write root and cannot be listed to keep "
            f"its hidden entries (what host programs run or read as configuration) "
            f"({exc.strerror}); choose a workspace that is not the home") from None


def _keep(path: str, roots: list[str], found: HomeCode, hops: int,
          mounts: aliases.Mounts) -> None:
    parts = [part for part in path.split("/") if part]
    current = "/"
    for index, part in enumerate(parts):
        here = os.path.join(current, part)
        last = index == len(parts) - 1
        inside = any(here.startswith(root.rstrip("/") + "/") for root in roots)
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            if inside:  # (the first missing name on the way: what lies below needs it)
                found.watched.add(here)
            return
        except OSError:
            return  # (a file on the way, or unsearchable: nothing can lie below it)
        if stat.S_ISLNK(info.st_mode):
            if inside:
                found.watched.add(here)
            if hops < _HOPS:
                target = os.path.normpath(os.path.join(current, os.readlink(here)))
                for name in _seen(os.path.join(target, *parts[index + 1:]), roots, mounts):
                    _keep(name, roots, found, hops + 1, mounts)
            return
        if last or not stat.S_ISDIR(info.st_mode):
            # (a file where a directory would be: kept whole, then nothing is made below it)
            if inside:
                found.readonly.add(here)
            return
        current = here
