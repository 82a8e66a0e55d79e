"""The seal of a change set: what its run was granted, recorded where the set's own files
cannot vouch for themselves (issue 29 part 2).

A change set's meta.json and baselines lie beside its layers, so checking its store's owner
and modes (changes.trusted) cannot tell a set Stockade wrote from one planted or edited by a
process of the same user: a sandbox that made a directory where the host later looks for its
state directory, a set copied from another store, meta.json rewritten to name other roots.
So the owner seals each set when its run starts: an HMAC-SHA256, under a per-user key
(`seal.key`, mode 0600, made by the first overlaid run, never by apply), of the run's id,
`created`, argv, write roots, protections, deny list and git mode and of the digest of each
baseline file. `apply` recomputes it and refuses (`changes_untrusted`) a set with no seal or
an older one, a key missing or one others could read or write, and a seal that does not
verify.

Where the key lives (statedir.key_dir): a place the password database names (the user's
home's `.local/state/stockade`, /var/lib/stockade for root), never one the environment
chooses. A launch masks and pins the state directories its own environment names and this
one; a state directory elsewhere (the one a shell with another XDG_STATE_HOME or HOME would
use) may have been built whole by a sandbox, a key of its own beside sets it sealed with it
(issue 29, C1), so a key beside the sets vouches for nothing. Sets sealed by an older
Stockade, with such a key, are refused and discarded. What it cannot tell: a process that
can itself read the key (outside every sandbox) can seal what it likes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat

from stockade.errors import ChangesError
from stockade.lifecycle import lease, statedir

KEY_NAME = "seal.key"  # (an older Stockade's, beside its sets, was changes.key)
KEY_BYTES = 32
SEALED = ("id", "created", "argv", "roots", "protected", "deny", "git")  # meta.json's fields
# What a seal made under the key of statedir.key_dir starts with (and what its HMAC covers
# first): one without it was made by an older Stockade, under a key beside its set.
SCHEME = "home-key-1:"


def key_path(directory: str) -> str:
    return os.path.join(directory, KEY_NAME)


def key_dir() -> str:
    """Where the key is (statedir.key_dir); ChangesError `changes_untrusted` if nowhere."""
    found = statedir.key_dir()
    if not found:
        raise ChangesError("changes_untrusted", "this user has no home directory in the "
                           "password database, where the change sets' key is kept (never "
                           "where the environment says): change sets cannot be sealed or "
                           "verified here")
    return found


def make_key(directory: str) -> bytes:
    """The key in `directory`, made now if it has none (by the owner of a run that starts:
    written whole under a temporary name, then linked into place, so that two runs starting
    at once agree on one)."""
    statedir.ensure(directory)
    path = key_path(directory)
    if not os.path.lexists(path):
        scratch = f"{path}.new-{secrets.token_hex(8)}"
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass  # (another run's, made meanwhile)
        finally:
            os.unlink(scratch)
        lease.sync_dir(directory)
    return read_key(directory)


def read_key(directory: str, run: str = "") -> bytes:
    """The key in `directory`; ChangesError `changes_untrusted` if it has none, or one that
    is a link, another user's, readable or writable by others, or not a key."""
    path = key_path(directory)
    discard = f" (`stockade discard {run}`)" if run else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ChangesError("changes_untrusted", f"the change set {run} cannot be verified: "
                           f"the change sets' key {path} is missing, so this Stockade never "
                           f"sealed a set (planted, or an older Stockade's), and it is never "
                           f"applied; discard it{discard}") from None
    except OSError as exc:
        raise ChangesError("changes_untrusted", f"the change sets' key {path} cannot be read "
                           f"({exc.strerror}); nothing is applied") from None
    try:
        info = os.fstat(fd)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or len(key) != KEY_BYTES:
        why = "is not a key Stockade made"
    elif not lease.owned(info):
        why = "is owned by another user"
    elif info.st_mode & 0o077:
        why = "is readable or writable by other users"
    else:
        return key
    raise ChangesError("changes_untrusted", f"the change sets' key {path} {why}: change sets "
                       "cannot be verified, so none is applied; if you did not make it so, "
                       f"remove it (rm {path}: the next overlaid run makes a new one) and "
                       "discard the sets it sealed")


def seal(key: bytes, meta: dict, bases: list[bytes]) -> str:
    """The seal of a set whose meta.json is `meta` and whose baseline files hold `bases`."""
    granted = json.dumps([meta.get(name) for name in SEALED], sort_keys=True,
                         separators=(",", ":")).encode()
    digests = b"".join(hashlib.sha256(base).digest() for base in bases)
    mac = hmac.new(key, SCHEME.encode() + granted + digests, hashlib.sha256).hexdigest()
    return SCHEME + mac


def verify(directory: str, meta: dict, bases: list[bytes]) -> None:
    """Return if `meta` (its baseline files holding `bases`) carries the seal the key in
    `directory` (key_dir: tests only choose another) gives it; ChangesError
    `changes_untrusted` otherwise, saying how to proceed (the set is discarded, never applied
    unverified)."""
    run = str(meta.get("id", ""))
    found = meta.get("seal")
    if isinstance(found, str) and not found.startswith(SCHEME):
        raise ChangesError("changes_untrusted", f"the change set {run} was sealed by an older "
                           "Stockade, under a key kept beside the change sets (which a "
                           "sandbox could have made), so it cannot be verified and is never "
                           f"applied; review it (`stockade changes {run}`), discard it "
                           f"(`stockade discard {run}`) and rerun its command to redo its "
                           "changes")
    if not isinstance(found, str):
        raise ChangesError("changes_untrusted", f"the change set {run} has no seal: it was "
                           "made by an older Stockade (or not by Stockade), so the roots its "
                           "run was granted cannot be verified and it is never applied; "
                           f"review it (`stockade changes {run}`), discard it (`stockade "
                           f"discard {run}`) and rerun its command to redo its changes")
    if not hmac.compare_digest(found, seal(read_key(directory, run), meta, bases)):
        raise ChangesError("changes_untrusted", f"the change set {run}'s seal does not verify "
                           "with this user's key: its roots, protections or baseline are not "
                           "the ones its run was granted (planted, copied from another store, "
                           f"or edited), so it is never applied; discard it (`stockade discard "
                           f"{run}`)")
