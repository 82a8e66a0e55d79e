"""What of the host's home directory makes a host program run code (policy.model.HOME_CODE:
git's XDG configuration, a .pth in the user site-packages, ~/.local/bin, shells' alias files,
...), kept from a command whose write roots hold it (issue 29 A2: the home as the workspace).

Each entry that exists below a write root is made read-only in the view (`readonly`: a mount
on it, which rename and unlink meet as EBUSY). Each that does not is a name the command may
not make (`watched`, "directory/name": pid 1 refuses making that name in that directory,
namewatch.c, whatever the call); the directories on its way that are missing are made now,
empty and private (as XDG programs make `~/.config`), so that every watched directory exists
and is pinned by the view (a mount point cannot be renamed away and another made in its
place). A symbolic link on the way is kept as a name the command may not make again (it may
delete it, not point it elsewhere), and what it leads to is kept the same way. What lies in
a write root the user granted as such (`--write ~/.config/nvim`) is the command's to write.
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


@dataclass
class HomeCode:
    readonly: set[str] = field(default_factory=set)
    watched: set[str] = field(default_factory=set)


def places(home: str, host_env: Mapping[str, str]) -> list[str]:
    """Every HOME_CODE path of this user: in `home` ($HOME) and the password database's home,
    and what of it lies in $XDG_CONFIG_HOME and $XDG_DATA_HOME."""
    homes = {os.path.normpath(h) for h in (home, statedir.passwd_home()) if os.path.isabs(h)}
    found = [os.path.join(h, name) for h in sorted(homes) for name in HOME_CODE]
    for variable, names in XDG_CODE.items():
        top = host_env.get(variable, "")
        if os.path.isabs(top):
            found += [os.path.join(os.path.normpath(top), name) for name in names]
    return found


def keep(paths: Iterable[str], roots: list[str]) -> HomeCode:
    """What of `paths` (absolute) the view keeps from a command writing the `roots`, under
    each name a root shows it by (aliases.py: the home bind-mounted at a second path)."""
    found = HomeCode()
    mounts = aliases.table()
    for path in paths:
        _keep_seen(os.path.normpath(path), roots, found, 0, mounts)
    return found


def _keep_seen(path: str, roots: list[str], found: HomeCode, hops: int,
               mounts: aliases.Mounts) -> None:
    for name in dict.fromkeys([path, *(name for root in roots
                                       for name in aliases.within(root, path, mounts))]):
        _keep(name, roots, found, hops, mounts)


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
            if not inside:
                return  # (beyond the command's reach)
            if last:
                found.watched.add(here)
                return
            _make(here)
            current = here
            continue
        except OSError:
            return  # (a file on the way, or unsearchable: nothing can lie below it)
        if stat.S_ISLNK(info.st_mode):
            if inside:
                found.watched.add(here)
            if hops < _HOPS:
                target = os.path.normpath(os.path.join(current, os.readlink(here)))
                _keep_seen(os.path.join(target, *parts[index + 1:]), roots, found, hops + 1,
                           mounts)
            return
        if last or not stat.S_ISDIR(info.st_mode):
            # (a file where a directory would be: kept whole, then nothing is made below it)
            if inside:
                found.readonly.add(here)
            return
        current = here


def _make(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnenforceableError(
            "filesystem.host_code",
            f"{path} lies in a write root, on the way to what of the home directory host "
            f"programs run (its start-up, configuration or programs), and cannot be made to "
            f"keep it ({exc.strerror}); make it, or choose a workspace that is not the "
            f"home") from None
