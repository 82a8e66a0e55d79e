"""Where Stockade keeps durable state (the launch ledger).

First match wins:

1. `STOCKADE_STATE_DIR`, an absolute path (the CLI's `--state-dir` sets it for its process
   and children);
2. `$XDG_STATE_HOME/stockade`, when `XDG_STATE_HOME` is an absolute path;
3. `/var/lib/stockade` for root, so that `sudo` with a preserved `HOME` never leaves root-owned
   state in a user's home (and root's state is where system state belongs);
4. `~/.local/state/stockade`.

Reconciliation deletes what the records in this directory name, so a directory that someone
else could write to is refused: it must be a real directory (not a symbolic link), owned by
this user, and writable by no one else. It is created mode 0700 on first use, never earlier.

The change sets' seal key is kept apart from all of this, in `key_dir()`: a place chosen from
the password database, never from the environment (see there).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping

from stockade.errors import UnavailableError, UsageError
from stockade.lifecycle import lease

ENV = "STOCKADE_STATE_DIR"
ROOT_STATE_DIR = "/var/lib/stockade"
ELSEWHERE = f"choose another with --state-dir or {ENV}"


def state_dir() -> str:
    """The state directory for this process (it may not exist yet)."""
    return candidates(os.environ, os.path.expanduser("~"))[0]


def candidates(env: Mapping[str, str], home: str) -> list[str]:
    """Every place this user's Stockade keeps state under some environment, the one `env`
    chooses first, and the seal key's (`key_dir`): what no sandbox may see
    (stockade/launch/compile.py masks them all), since a sandbox that reaches the daemon's
    sockets, plants ledger records or makes the key acts outside it."""
    found = []
    explicit = env.get(ENV)
    if explicit and not os.path.isabs(explicit):  # (--state-dir makes its own absolute)
        raise UsageError(f"{ENV}={explicit[:80]!r} is a relative path, which each process "
                         "would find under its own working directory: give an absolute one")
    if explicit:
        found.append(explicit)
    xdg = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        found.append(os.path.join(xdg, "stockade"))
    if lease.superuser():
        found.append(ROOT_STATE_DIR)
    found.append(os.path.join(home, ".local", "state", "stockade"))
    keys = key_dir()
    if keys:
        found.append(keys)
    return list(dict.fromkeys(os.path.normpath(path) for path in found))


def key_dir() -> str:
    """Where the change sets' seal key is kept (changeseal.py): /var/lib/stockade for root,
    else `.local/state/stockade` in this user's home as the password database names it; ""
    if there is none (Windows, a uid with no entry or no absolute home). Never chosen from the
    environment: a launch masks only the state directories its own environment names, so a
    sandbox may build a whole state directory, key and all, where a shell with another
    environment (another HOME, XDG_STATE_HOME or STOCKADE_STATE_DIR) later looks for one;
    this place is the same for every process of the user, and every launch masks it
    (`candidates`). The private homes lie beside it for the same reason (homes.py)."""
    outer = _outer_uid()
    if lease.superuser() and outer == 0:
        return ROOT_STATE_DIR
    home = passwd_home(outer)
    return os.path.join(home, ".local", "state", "stockade") if home else ""


def _outer_uid() -> int | None:
    """This process's user as the namespace above sees it (/proc/self/uid_map): a user who
    made a user namespace of their own and is root in it is that user still, whose places
    are theirs (not root's, which they cannot write). None off Linux."""
    if not hasattr(os, "geteuid"):
        return None
    uid = os.geteuid()
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, outside, count = map(int, line.split())
                if inside <= uid < inside + count:
                    return outside + uid - inside
    except (OSError, ValueError):
        pass
    return uid


def passwd_home(uid: int | None = None) -> str:
    """This user's (or `uid`'s) home as the password database names it (whatever HOME
    says); "" if it names none (Windows, a uid with no entry, a home that is not an absolute
    path)."""
    try:
        import pwd  # (POSIX only)

        home = pwd.getpwuid(os.geteuid() if uid is None else uid).pw_dir
    except (ImportError, KeyError):
        return ""
    return os.path.normpath(home) if os.path.isabs(home) else ""


def ensure(path: str) -> None:
    """Create `path` (mode 0700, parents as needed) or check that it is safe to use."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnavailableError("ledger_unusable", f"the state directory {path} cannot be "
                               f"created ({exc.strerror}); {ELSEWHERE}") from None
    check(path)


def bind_socket(path: str) -> socket.socket:
    """A unix stream socket bound at `path` (in a directory `ensure` made or checked), mode
    0600 from the moment it exists. The mode is set on the socket before bind, never through
    the umask: the umask is the whole process's, and a launch (whose command takes it) or a
    directory made in another thread meanwhile took 0177."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(listener.fileno(), 0o600)  # (Linux: bind makes the file with this mode)
        listener.bind(path)
    except BaseException:
        listener.close()
        raise
    return listener


def check_makeable(path: str) -> None:
    """Raise `ledger_unusable` if `path`, which does not exist yet, could not be made: what
    lies above it is not a directory."""
    above = os.path.dirname(path)
    while not os.path.lexists(above) and above != os.path.dirname(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise UnavailableError("ledger_unusable", f"the state directory {path} cannot be "
                               f"made ({above} is not a directory); {ELSEWHERE}")


def check(path: str) -> None:
    """Raise `ledger_unusable` unless `path` is a directory only this user can write."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnavailableError("ledger_unusable", f"the state directory {path} cannot be "
                               f"read ({exc.strerror}); {ELSEWHERE}") from None
    why = lease.distrust(info)
    if why is None and not stat.S_ISDIR(info.st_mode):
        why = "is not a directory"
    if why is None:
        return
    raise UnavailableError("ledger_unusable", f"the state directory {path} {why}; {ELSEWHERE}")
