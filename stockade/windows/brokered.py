"""The launch path's binding to the one-shot broker (broker.py): how the host has its launch's
child started.

Each attempt starts a broker process (`spawn`: this Python's own program, `-I -S`, detached
from the owner's console, `SystemRoot` its whole environment, inheriting exactly the launch's
Job handle — a duplicate that may only put a process in the Job, job.assign_only — and the
child's three standard handles). Then the manifest bound to that process's PID, with a fresh
nonce and the request's digest, is written closed (manifestfile.py), and the control frame
(the nonce, the digest, the manifest's path and file identity) goes to the broker's stdin,
never to a file. Its one answer is read from its stdout within BROKER_WAIT; a broker that
gives none is killed (`broker_failed`), and a manifest it did not consume is deleted by the
host. The manifest is in the launch's ledger record before it is written (manifestfile.KIND:
its path, and the broker's process id and creation time), so that a host that dies before
deleting it leaves it to the next reconcile (manifestfile.remove_left). Launched: the
suspended child is opened by its ids for the host's own verification (handle.py), which never
trusts the broker's word for what it made. Refused: the broker's typed refusal (or the
command's StartError) is raised as it was; the launcher failed: its OSError, winerror and all,
so handle.start can type it or retry.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from stockade.errors import BrokerError, StartError
from stockade.launch.request import LaunchRequest
from stockade.lifecycle import statedir
from stockade.windows import constants as c
from stockade.windows import manifestfile, process, procid, program
from stockade.windows.manifest import NONCE_BYTES, Context, Control, Manifest, decode_answer

if TYPE_CHECKING:
    from stockade.lifecycle.ledger import LaunchRecord

BROKER_WAIT = 60.0  # seconds for a broker to start, launch and answer
DIRECTORY = "broker"  # of the state directory: the manifests, each there until consumed
# The broker's program (`python -I -S -c BOOT PACKAGES`): this package's directory is added
# after the standard library's, nothing else of the environment's or the user's.
BOOT = ("import sys; sys.path.append(sys.argv[1]); "
        "from stockade.windows.broker import main; sys.exit(main())")
_PACKAGES = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Spawned(Protocol):
    """The broker process, as subprocess.Popen gives it."""

    pid: int

    def communicate(self, input: bytes | None = None,
                    timeout: float | None = None) -> tuple[bytes, bytes]: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


def spawn(handles: tuple[int, ...]) -> subprocess.Popen:
    """A broker process inheriting `handles` (and its own three pipes), nothing else."""
    startup = subprocess.STARTUPINFO(lpAttributeList={"handle_list": list(handles)})
    return subprocess.Popen([program.interpreter(), "-I", "-S", "-c", BOOT, _PACKAGES],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, close_fds=True, startupinfo=startup,
                            creationflags=c.DETACHED_PROCESS,
                            env={"SystemRoot": os.environ.get("SystemRoot", "C:\\Windows")})


@dataclass(frozen=True)
class Calls:
    """What the binding does on Windows (the tests give their models)."""

    spawn: Callable[[tuple[int, ...]], Spawned] = spawn
    created: Callable[[int], int] = procid.created  # (of the broker, while its Popen holds it)
    write: Callable[[str, bytes, str], manifestfile.Written] = manifestfile.write
    discard: Callable[[str], bool] = manifestfile.discard
    opened: Callable[[int, int], process.Created] = process.opened


@dataclass(frozen=True)
class Started:
    created: process.Created
    broker_pid: int
    manifest_consumed: bool  # nothing was left at its path once the broker had answered


def directory(state_root: str) -> str:
    path = os.path.join(state_root, DIRECTORY)
    statedir.ensure(path)
    return path


def create(request: LaunchRequest, context: Context, manifests: str, user_sid: str,
           record: LaunchRecord, calls: Calls | None = None) -> Started:
    """The launch's child, started by a broker of its own from a manifest in `manifests`,
    recorded in the launch's `record` before it is written."""
    calls = calls or Calls()
    broker = calls.spawn((context.job, *context.stdio))
    written = None
    try:
        nonce = secrets.token_hex(NONCE_BYTES)
        path = manifestfile.fresh_path(manifests)
        record.add(manifestfile.KIND, path, {"broker": broker.pid,
                                             "created": calls.created(broker.pid)})
        written = calls.write(path, Manifest.for_launch(broker.pid, nonce, request,
                                                        context).encode(), user_sid)
        out, err = broker.communicate(Control(nonce, request.digest, written.path,
                                              written.file_id).encode(), timeout=BROKER_WAIT)
    except subprocess.TimeoutExpired:
        raise BrokerError("broker_failed", "the broker did not answer within "
                          f"{BROKER_WAIT:g}s") from None
    finally:
        if broker.poll() is None:  # (no answer in time, or the manifest was not written)
            broker.kill()
            broker.communicate()
        left = written is not None and calls.discard(written.path)
    try:
        said = decode_answer(out)
    except BrokerError:
        lines = err.decode(errors="replace").strip().splitlines()
        raise BrokerError("broker_failed", "the broker ended without an answer"
                          + (f": {lines[-1][:200]}" if lines else "")) from None
    if said.outcome == "refused":
        kind = BrokerError if said.body["kind"] == "broker" else StartError
        raise kind(said.body["code"], said.body["message"])
    if said.outcome == "failed":
        error = OSError(None, said.body["message"])
        error.winerror = said.body["winerror"]
        raise error
    return Started(calls.opened(said.body["pid"], said.body["thread_id"]), broker.pid,
                   not left)
