"""Plant a change set for the host's `stockade apply` (G1): make the directory STATE (argv:
STATE VICTIM ANSWER WHEN) where the host looks for its state directory, with a change set in it
as Stockade writes one, whose root is VICTIM (never granted), adding a file there. WHEN
"future": its `created` lies in the future (so that it is the newest); "past": it is made to
pass every check of the store (`created` a moment ago, modes 0700 and 0600, no links) and
carries a seal of its own making (it cannot read this user's key); "keyed": the same, and the
state directory has a key of the set's own (changes.key, where an older Stockade read it, and
seal.key), the seal made with it as Stockade makes one. Then wait for the host's apply: the
host writes what it answered to ANSWER. Being applied is an escape (the file lands
outside)."""

import hashlib
import hmac
import json
import os
import time

from _common import ARGS, CannotTry, Refused, attempt

STATE, VICTIM, ANSWER, WHEN = ARGS
RUN = "0" * 32


def plant():
    path = os.path.join(STATE, "changes", RUN)
    os.makedirs(os.path.join(path, "layers", "0", "upper"), mode=0o700)
    for made in (STATE, os.path.join(STATE, "changes"), path, os.path.join(path, "layers"),
                 os.path.join(path, "layers", "0")):
        os.chmod(made, 0o700)  # (whatever the umask: as Stockade makes them)
    # The upper directory shows the root's own mode: the usual one, so that no mode change of
    # the root (which its empty baseline cannot vouch for) conflicts.
    os.chmod(os.path.join(path, "layers", "0", "upper"), 0o755)
    os.mkdir(os.path.join(path, "layers", "0", "work"), 0o700)
    with open(os.path.join(path, "layers", "0", "upper", "planted-by-a-sandbox"), "w") as f:
        f.write("written outside by a planted change set\n")
    meta = {"format": "stockade-changes", "version": 1, "id": RUN,
            "created": time.time() + (86400 if WHEN == "future" else -5), "argv": ["true"],
            "roots": [VICTIM], "protected": [], "deny": [], "git": "read-write",
            "status": "finished", "exit_code": 0, "seal": os.urandom(32).hex()}
    if WHEN == "keyed":
        key = os.urandom(32)
        for name in ("changes.key", "seal.key"):
            with open(os.path.join(STATE, name), "wb") as f:
                f.write(key)
            os.chmod(os.path.join(STATE, name), 0o600)
        meta["seal"] = seal(key, meta, [b"{}"])
    # (meta.json last, whole, by a rename: the host starts once it is there)
    for name, data in (("base-0.json", {}), ("meta.json", meta)):
        with open(os.path.join(path, name + ".part"), "w") as f:
            json.dump(data, f)
        os.chmod(os.path.join(path, name + ".part"), 0o600)
        os.rename(os.path.join(path, name + ".part"), os.path.join(path, name))


def seal(key, meta, bases):
    """As stockade/lifecycle/changeseal.py seals a set (the host checks that it verifies under
    this key: a seal that does not would prove nothing)."""
    scheme = b"home-key-1:"
    fields = ("id", "created", "argv", "roots", "protected", "deny", "git")
    granted = json.dumps([meta.get(name) for name in fields], sort_keys=True,
                         separators=(",", ":")).encode()
    digests = b"".join(hashlib.sha256(base).digest() for base in bases)
    return scheme.decode() + hmac.new(key, scheme + granted + digests, "sha256").hexdigest()


def applied():
    plant()
    deadline = time.monotonic() + 60
    while not os.path.exists(ANSWER):
        if time.monotonic() > deadline:
            raise CannotTry("the host never applied")
        time.sleep(0.05)
    with open(ANSWER) as f:
        answer = f.read().strip()
    if answer != "applied":
        raise Refused(answer or "REFUSED", "the host's apply refused the planted set")
    return "the host applied it"


attempt("have the host apply a planted change set writing outside", applied)
