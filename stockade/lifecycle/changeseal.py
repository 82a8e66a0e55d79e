"""The seal of a change set: what its run was granted, recorded where the set's own files
cannot vouch for themselves (issue 29 part 2).

A change set's meta.json and baselines lie beside its layers, so checking its store's owner
and modes (changes.trusted) cannot tell a set Stockade wrote from one planted or edited by a
process of the same user: a sandbox that made a directory where the host later looks for its
state directory, a set copied from another store, meta.json rewritten to name other roots.
So the owner seals each set when its run starts: an HMAC-SHA256, under a per-user key kept
in the state directory (`changes.key`, mode 0600, made once by the first overlaid run, never
by apply), of the run's id, `created`, argv, write roots, protections, deny list and git mode
and of the digest of each baseline file. `apply` recomputes it and refuses
(`changes_untrusted`) a set with no seal, a store with no key or one others could read or
write, and a seal that does not verify.

Why a key and not a second record of the roots: the state directory is the one place every
Stockade view masks and pins (no sandbox reads or writes it), so a secret there is out of a
sandbox's reach wherever else its sets end up; a planted or fresh state directory has no key
of this user's, and a set copied or edited does not verify. What it cannot tell: a process
that can itself read the state directory's key (outside every sandbox) can seal what it likes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat

from stockade.errors import ChangesError
from stockade.lifecycle import lease

KEY_NAME = "changes.key"
KEY_BYTES = 32
SEALED = ("id", "created", "argv", "roots", "protected", "deny", "git")  # meta.json's fields


def key_path(state: str) -> str:
    return os.path.join(state, KEY_NAME)


def make_key(state: str) -> bytes:
    """The state directory's key, made now if it has none (by the owner of a run that starts:
    written whole under a temporary name, then linked into place, so that two runs starting
    at once agree on one)."""
    path = key_path(state)
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
        lease.sync_dir(state)
    return read_key(state)


def read_key(state: str, run: str = "") -> bytes:
    """The state directory's key; ChangesError `changes_untrusted` if it has none, or one
    that is a link, another user's, readable or writable by others, or not a key."""
    path = key_path(state)
    discard = f" (`stockade discard {run}`)" if run else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ChangesError("changes_untrusted", f"the change set {run} is in a store with no "
                           f"key ({path} is missing): Stockade never made a set there, so it "
                           f"is never applied; discard it{discard}") from None
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
                       "cannot be verified, so none is applied")


def seal(key: bytes, meta: dict, bases: list[bytes]) -> str:
    """The seal of a set whose meta.json is `meta` and whose baseline files hold `bases`."""
    granted = json.dumps([meta.get(name) for name in SEALED], sort_keys=True,
                         separators=(",", ":")).encode()
    digests = b"".join(hashlib.sha256(base).digest() for base in bases)
    return hmac.new(key, granted + digests, hashlib.sha256).hexdigest()


def verify(state: str, meta: dict, bases: list[bytes]) -> None:
    """Return if `meta` (a set of the store in `state`, its baseline files holding `bases`)
    carries the seal this store's key gives it; ChangesError `changes_untrusted` otherwise,
    saying how to proceed (the set is discarded, never applied unverified)."""
    run = str(meta.get("id", ""))
    found = meta.get("seal")
    if not isinstance(found, str):
        raise ChangesError("changes_untrusted", f"the change set {run} has no seal: it was "
                           "made by an older Stockade (or not by Stockade), so the roots its "
                           "run was granted cannot be verified and it is never applied; "
                           f"review it (`stockade changes {run}`), discard it (`stockade "
                           f"discard {run}`) and rerun its command to redo its changes")
    if not hmac.compare_digest(found, seal(read_key(state, run), meta, bases)):
        raise ChangesError("changes_untrusted", f"the change set {run}'s seal does not verify "
                           "with this store's key: its roots, protections or baseline are not "
                           "the ones its run was granted (planted, copied from another store, "
                           f"or edited), so it is never applied; discard it (`stockade discard "
                           f"{run}`)")
