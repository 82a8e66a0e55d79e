"""The sandbox's own home directories (`filesystem.home = "private"`): one per workspace, kept
between runs, so that tools with a cache or configuration in `$HOME` (npm, pip, cargo, go,
git's global configuration, ...) work and reuse what they downloaded.

Where. `<key directory>-homes/<workspace's name>-<hash of its path>`, beside the directory of
the change sets' seal key (statedir.key_dir: `/var/lib/stockade-homes` for root, else
`~/.local/state/stockade-homes` in the home the password database names), never the host's
home itself: `HOME` points there in the sandbox. One place per user whatever the environment
or the state directory in use (`--state-dir`, `STOCKADE_STATE_DIR`): a place chosen from the
environment would be masked only from launches whose environment names it, and a launch with
another environment could reach a home there and plant what its workspace's next run reads
(issue 29, H2). This directory is masked from every sandbox, which sees its own home there and
nothing else (compile.py, linux/mnt.py). Made mode 0700 on first use, with `.config/git/` in
it, where `GIT_CONFIG_GLOBAL` points (`~/.gitconfig` is a protected name, which the command
cannot make), and its identity (device and inode) recorded beside it (`.made/<its name>`,
which no sandbox sees; no home's name starts with a dot).
Checked at every launch as the state directory is: a real directory, owned by this user,
writable by no one else, and the one recorded: a home Stockade did not make (the names are
predictable: one made by a sandbox that could reach the homes' directory) is removed and
made afresh. (Homes an older Stockade made beside another state directory are not used.)
Nothing inside it is ever opened by the host after it was made: a previous run could have put
a link anywhere in it.

Not with `filesystem.workspace = "overlay"` (stockade/launch/compile.py): every write root there
is a layer to review, and the home's caches would be in every change set.

Trust. What one run leaves there, the next run of the same workspace reads: a hostile command
can plant a configuration (a registry, an npm script shell, a git alias) for the next sandboxed
run, which is as confined as the first. No host tool reads it; do not point one at it (nor put
it on a PATH). Delete the directory to start afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator

from stockade.errors import StockadeError, UnenforceableError
from stockade.lifecycle import lease, treewalk

SUFFIX = "-homes"
RECORDS = ".made"  # (in the homes' directory: each home's identity, by its name)
GIT_CONFIG = os.path.join(".config", "git", "config")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def home_for(workspace: str, keys: str) -> str:
    """The private home of `workspace` (a canonical path), in the homes' directory beside the
    seal key's directory `keys` (statedir.key_dir; it may not exist yet)."""
    name = _UNSAFE.sub("_", os.path.basename(workspace)).lstrip(".") or "root"
    key = hashlib.sha256(os.fsencode(workspace)).hexdigest()[:16]
    return os.path.join(keys + SUFFIX, f"{name[:40]}-{key}")


def ensure(home: str, workspace: str = "") -> None:
    """Make `home` (and `.config/git` in it) if it does not exist and record it (with
    `workspace`, whose home it is: `prune`), then check that it is this user's alone and the
    one recorded (else it is remade); UnenforceableError("filesystem.home") if it cannot be
    used."""
    with _homes_locked(home):
        record = _record_of(home)
        made = _make(home)
        info = _checked(home)
        if not made and (_recorded(record) or "").partition("\n")[0] + "\n" != _identity(info):
            # Not the one Stockade made (the names are predictable: a sandbox that reached it
            # may have planted it, or an older Stockade made it): remade, empty.
            with contextlib.suppress(OSError):
                treewalk.remove(home)
            if not _make(home):
                raise _unusable(home, "was not made by Stockade and cannot be removed")
            made, info = True, _checked(home)
        if made:
            _record(record, _identity(info) + json.dumps(workspace) + "\n", home)


@contextlib.contextmanager
def _homes_locked(home: str) -> Iterator[None]:
    """The homes' directory locked (flock) for one home's making, check and record: launches
    of one workspace at once each took the other's home, made but not yet recorded, for a
    planted one and removed it."""
    import fcntl  # (POSIX: private homes are Linux's)

    parent = os.path.dirname(home)
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _unusable(home, f"cannot be made ({exc.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _checked(home: str) -> os.stat_result:
    try:
        info = os.lstat(home)
    except OSError as exc:
        raise _unusable(home, f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise _unusable(home, "is not a directory (a symbolic link is refused)")
    if not lease.owned(info) or not lease.private(info):
        raise _unusable(home, "is owned or writable by another user")
    return info


def _identity(info: os.stat_result) -> str:
    return f"{info.st_dev}:{info.st_ino}\n"


def _make(home: str) -> bool:
    """Make `home` and `.config/git` in it; False if it exists already."""
    try:
        os.makedirs(os.path.dirname(home), mode=0o700, exist_ok=True)
        os.mkdir(home, 0o700)
    except FileExistsError:
        return False  # (what is inside is the sandbox's: never touched from here)
    except OSError as exc:
        raise _unusable(home, f"cannot be made ({exc.strerror})") from None
    os.makedirs(os.path.join(home, os.path.dirname(GIT_CONFIG)), mode=0o700)
    return True


def _record(record: str, identity: str, home: str) -> None:
    """Write `identity` at `record` whole (a temporary file renamed over it)."""
    from stockade.lifecycle import statedir

    try:
        statedir.ensure(os.path.dirname(record))
        temporary = f"{record}.{os.getpid()}.tmp"
        with open(temporary, "w", opener=lambda path, flags: os.open(path, flags, 0o600)) as f:
            f.write(identity)
        os.replace(temporary, record)
    except (OSError, StockadeError) as exc:
        raise _unusable(home, f"cannot be recorded ({getattr(exc, 'strerror', None) or exc})"
                        ) from None


def _record_of(home: str) -> str:
    return os.path.join(os.path.dirname(home), RECORDS, os.path.basename(home))


def _recorded(record: str) -> str | None:
    try:
        with open(record, opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW)
                  ) as f:
            return f.read()
    except OSError:
        return None


def _unusable(home: str, why: str) -> UnenforceableError:
    return UnenforceableError(
        "filesystem.home", f"the sandbox's private home {home} {why}; remove it, or set "
        'filesystem.home = "host"')


def prune(keys: str, under: str = "/") -> list[str]:
    """Remove the private homes (beside `keys`, statedir.key_dir) of workspaces at or below
    `under` that no longer exist, as their records name them (`stockade reconcile`); the homes
    removed. A home whose record names no workspace (made before workspaces were recorded), or
    whose workspace cannot be looked up now (_gone), is kept."""
    records = os.path.join(keys + SUFFIX, RECORDS)
    try:
        names = sorted(os.listdir(records))
    except OSError:
        return []
    removed = []
    for name in names:
        try:
            workspace = json.loads((_recorded(os.path.join(records, name)) or "")
                                   .split("\n")[1])
        except (IndexError, ValueError):
            continue
        if not isinstance(workspace, str) or not workspace or not _gone(workspace) \
                or os.path.commonpath([under, workspace]) != under:
            continue
        home = os.path.join(keys + SUFFIX, name)
        if os.path.isdir(home) and not os.path.islink(home):
            treewalk.remove(home)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(records, name))
        removed.append(home)
    return removed


def _gone(path: str) -> bool:
    """Whether `path` plainly does not exist. A look-up that fails otherwise (a directory on
    the way unsearchable for now, a locked home: EACCES, EIO) says nothing of it: its home is
    kept (issue 29 P1). (A workspace on a disk not mounted, below an empty mount point, does
    look gone: said in docs/policy.md.)"""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def discard(workspace: str, keys: str) -> None:
    """Remove the private home of `workspace` beside `keys`, if there is one (a scratch
    workspace's: nothing else would ever remove it). Links in it are removed, not followed;
    directories the command made read-only are removed too (treewalk.remove)."""
    home = home_for(os.path.realpath(workspace), keys)
    if os.path.isdir(home) and not os.path.islink(home):
        treewalk.remove(home)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_record_of(home))
