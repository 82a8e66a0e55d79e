"""The one-shot launch broker (issue 36; Maka's shape): a process of its own per launch that
can do one thing, start the launch's child through the AppContainer launcher
(process.create), and that only for the one manifest its host wrote for it.

The host (brokered.py) starts it, writes the manifest bound to its PID (manifestfile.py:
closed to every process but this user's own, never a sandbox's) and sends it, on its stdin,
the manifest's nonce, the launch's digest and where the manifest is. The broker consumes the
manifest (opened alone, deleted once closed, checked to be the file the host wrote) and
refuses, typed (`BrokerError`) and before anything is launched, unless: the frames are of its
version, closed and within their bounds (manifest.py); the manifest names this broker's own
PID; its nonce is the one the host sent; and the digest recomputed from the complete request
it holds is both the one it names and the one the host sent. Then it derives the launch from
that request alone — the program (looked up and checked against the roots again), the command
line, the environment block, the mitigations, the network's capability (netfence.py) — with
the context's AppContainer, desktop and inherited handles, and calls the launcher. It answers
once and ends: a broker is spent by its first frame, whatever became of it
(`broker_manifest_reused` for any other), and its only handle on the Job may do nothing but
put a process in it (job.assign_only).

Run by brokered.py as `python -I -S -c BOOT DIRECTORY`: the standard library and this package.
"""

from __future__ import annotations

import hmac
import os
import sys
from collections.abc import Callable
from typing import BinaryIO

from stockade.errors import BrokerError, StartError
from stockade.launch.request import LaunchRequest
from stockade.windows import cmdline, envblock, netfence, process, program
from stockade.windows.manifest import (
    MAX_CONTROL,
    MAX_MANIFEST,
    MAX_MESSAGE,
    Answer,
    Context,
    decode_control,
    decode_manifest,
)

Consume = Callable[[str, str, int], bytes]  # (path, file id, bound) -> the manifest, deleted
Launcher = Callable[[process.Launch], process.Created]


def launch_for(request: LaunchRequest, context: Context,
               resolve: Callable[[LaunchRequest], str] = program.executable) -> process.Launch:
    """What the launcher is given: everything the child runs from the request itself, where and
    as what it runs from the context."""
    return process.Launch(
        application=resolve(request), command_line=cmdline.command_line(request.argv),
        environment=envblock.environment_block(envblock.with_temp(request.env, context.temp)),
        cwd=request.cwd, desktop=context.desktop, package_sid=context.package_sid,
        capabilities=context.capabilities + netfence.capabilities(request), job=context.job,
        stdio=context.stdio,
        mitigations=process.mitigations(request.exec_from_write))


class Broker:
    """One launch's broker: `pid` its own, `consume` reads (and deletes) its manifest,
    `launcher` is the AppContainer launcher, the only thing it calls."""

    def __init__(self, pid: int, consume: Consume, launcher: Launcher,
                 resolve: Callable[[LaunchRequest], str] = program.executable) -> None:
        self._pid, self._consume, self._launcher, self._resolve = pid, consume, launcher, resolve
        self._spent = False

    def launch(self, frame: bytes) -> process.Created:
        """Launch what the control frame's manifest authorizes, or refuse (BrokerError)."""
        if self._spent:
            raise BrokerError("broker_manifest_reused", "this broker has taken its one manifest "
                              "already: a broker launches once")
        self._spent = True
        control = decode_control(frame)
        manifest = decode_manifest(self._consume(control.path, control.file_id, MAX_MANIFEST))
        if manifest.broker_pid != self._pid:
            raise BrokerError("broker_pid_mismatch", f"the manifest is bound to process "
                              f"{manifest.broker_pid}, not to this broker ({self._pid})")
        if not hmac.compare_digest(manifest.nonce, control.nonce):
            raise BrokerError("broker_nonce_mismatch",
                              "the manifest's nonce is not the one its host sent")
        recomputed = manifest.request.digest
        if not (hmac.compare_digest(recomputed, manifest.digest)
                and hmac.compare_digest(recomputed, control.digest)):
            raise BrokerError("broker_digest_mismatch", "the digest of the manifest's request "
                              "is not the one the manifest and its host name")
        return self._launcher(launch_for(manifest.request, manifest.context, self._resolve))


def answer(broker: Broker, frame: bytes) -> Answer:
    """The broker's one answer to its control frame."""
    try:
        created = broker.launch(frame)
    except BrokerError as exc:
        return Answer("refused", {"kind": "broker", "code": exc.code,
                                  "message": exc.message[:MAX_MESSAGE]})
    except StartError as exc:  # (the command's own: its program is not to be found)
        return Answer("refused", {"kind": "start", "code": exc.code,
                                  "message": exc.message[:MAX_MESSAGE]})
    except ValueError as exc:  # (a request Windows cannot hold: an environment block, a line)
        return Answer("refused", {"kind": "broker", "code": "broker_bad_request",
                                  "message": str(exc)[:MAX_MESSAGE]})
    except OSError as exc:  # (the launcher's: CreateProcessW failed)
        return Answer("failed", {"winerror": getattr(exc, "winerror", None) or 0,
                                 "message": (exc.strerror or exc.__class__.__name__)[:MAX_MESSAGE]})
    return Answer("launched", {"pid": created.pid, "thread_id": created.thread_id})


def serve(stdin: BinaryIO, stdout: BinaryIO, broker: Broker) -> int:
    """Read the one control frame (the host closes its end after it; past the bound is
    refused unread), answer it, end: 0 once launched, else 1."""
    said = answer(broker, stdin.read(MAX_CONTROL + 1))
    stdout.write(said.encode())
    stdout.flush()
    return 0 if said.outcome == "launched" else 1


def main() -> int:
    from stockade.windows import manifestfile, tokens

    user = tokens.current_user_sid()
    broker = Broker(os.getpid(), lambda path, file_id, limit: manifestfile.consume(
        path, file_id, limit, user), process.create)
    return serve(sys.stdin.buffer, sys.stdout.buffer, broker)
