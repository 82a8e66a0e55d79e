"""Result: what one sandboxed run produced, shaped like subprocess.CompletedProcess; and the
errors `check=True` raises, shaped like subprocess's."""

from __future__ import annotations

import base64
import json
import re
import signal as _signal
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from stockade.visibletext import visible

if TYPE_CHECKING:
    from stockade.lifecycle.changes import ChangeSet

_PLAIN_HOST = re.compile(r"[A-Za-z0-9._*:\[\]-]+")  # (a name or address, shown as is)


@dataclass(frozen=True)
class Violation:
    """Something the sandbox stopped or cut short: `kind` is stable (e.g. `limits.timeout`)."""

    kind: str
    detail: str
    # A network denial's record as the proxy or the guard wrote it: (protocol, host, port,
    # reason, the address a name resolved to or ""). Its grant is made from these fields,
    # never from `detail`, whose host the command chose (issue 34, D2).
    network: tuple[str, str, int, str, str] | None = None

    def __post_init__(self) -> None:
        # A detail may hold what the command named (a directory, a host): escaped as `stockade
        # changes` shows names, so that printing it writes no control sequence or forged line
        # to a terminal, and holds no byte that is not UTF-8 (which strict writers refuse).
        object.__setattr__(self, "detail", visible(self.detail))
        if self.network is not None:  # (a list, read back from JSON)
            object.__setattr__(self, "network", tuple(self.network))


def network_denials(records: list[dict]) -> list[Violation]:
    """A `network.denied` Violation per denial record of the egress proxy (or the guard). A
    name refused for the address it resolved to is said with the record's message, which
    names that address and how to allow it: the name alone does not say why."""
    return [_network_denial(d) for d in records if d.get("decision", "deny") == "deny"]


def _network_denial(record: dict) -> Violation:
    reason = record.get("reason") or record.get("rule") or ""
    resolved = _resolved(record)
    # (a host that is not a plain name is quoted: the command chose it, spaces and all)
    host = record["host"]
    shown = host if _PLAIN_HOST.fullmatch(host) else json.dumps(host)
    return Violation("network.denied", f"{record['protocol']} {shown}:{record['port']}: {reason}"
                                       + (f" ({record['message']})" if resolved else ""),
                     (record["protocol"], host, record["port"], reason,
                      record["address"] if resolved else ""))


def _resolved(record: dict) -> bool:
    """Whether a denial record judged an address a name resolved to (not the host itself)."""
    address = record.get("address")
    return address is not None and address != record["host"].strip("[]")


@dataclass(frozen=True)
class Result:
    """What one sandboxed run produced. It answers as subprocess.CompletedProcess does:
    `returncode` (the exit code, or -N when killed by signal N), `args`, `stdout`, `stderr`
    (bytes, str in text mode, None when not captured) and `check_returncode()`. Beyond it:
    why the run ended (`timed_out`, `cancelled`, `violations`), what was enforced, timings."""

    exit_code: int | None            # None when the command was killed by a signal
    signal: int | None
    stdout: bytes | str | None       # None: not captured (relayed or discarded)
    stderr: bytes | str | None
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    cancelled: bool
    duration: float                  # seconds from launch to settlement
    backend: str
    digest: str
    request_id: str
    violations: tuple[Violation, ...] = ()
    enforced: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # milliseconds per launch stage
    # The egress proxy's decision records (JSON-ready: time, request_id, protocol, host, port,
    # decision, rule, reason, ...): every denial, in allowlist mode.
    network_log: tuple[dict, ...] = ()
    args: Sequence[str] | str = ()  # the command as the caller gave it (a string: shell=True)
    timeout: float | None = None    # seconds: the wall-clock limit it ran under
    # filesystem.workspace = "overlay": what the run changed, pending until applied or
    # discarded (`added`, `modified`, `deleted`, `diff()`, `apply()`, `discard()`); None if
    # it changed nothing (nothing is kept)
    changes: ChangeSet | None = None

    @property
    def returncode(self) -> int:
        """As subprocess's: the exit code, or -N for a command killed by signal N."""
        if self.exit_code is not None:
            return self.exit_code
        return -(self.signal or 0)

    @property
    def exit_status(self) -> int:
        """The shell convention, what `stockade run` exits with: the exit code, or 128 + N for
        a command killed by signal N (137 after a timeout)."""
        if self.exit_code is not None:
            return self.exit_code
        return 128 + (self.signal or 0)

    def check_returncode(self) -> None:
        """Raise CommandFailed if the command did not exit 0 (CommandTimedOut if its timeout
        killed it), as CompletedProcess.check_returncode does."""
        if self.returncode == 0:
            return
        if self.timed_out:
            raise CommandTimedOut(self)
        raise CommandFailed(self)

    def to_json(self) -> dict:
        """A JSON-ready summary: output as text, and where it is not UTF-8 (undecodable bytes
        replaced there) also whole, base64-encoded, as `stdout_base64` / `stderr_base64`
        (else None)."""
        body = asdict(replace(self, changes=None))
        if self.changes is not None:
            body["changes"] = summary(self.changes)
        for name in ("stdout", "stderr"):
            value = getattr(self, name)
            body[f"{name}_base64"] = None
            if isinstance(value, bytes):
                body[name] = value.decode("utf-8", "replace")
                if body[name].encode() != value:
                    body[f"{name}_base64"] = base64.b64encode(value).decode("ascii")
        body["signal_name"] = _signal_name(self.signal)
        body["returncode"] = self.returncode
        body["exit_status"] = self.exit_status
        return body


def summary(changes: ChangeSet, found: list | None = None) -> dict:
    """A change set, JSON-ready: its run id, status and the paths each kind of change names
    ("unshown": what the review cannot show, which apply refuses), and `modes`: the octal
    mode of each added path whose mode the review shows (changeview.notable_mode); of
    `found`, from `changes.changes()`, if given."""
    from stockade.lifecycle.changeview import notable_mode

    found = changes.changes() if found is None else found
    return {"id": changes.id, "status": changes.status,
            **{kind: [c.path for c in found if c.kind == kind]
               for kind in ("added", "modified", "deleted", "unshown")},
            "modes": {c.path: f"{c.mode:o}" for c in found if notable_mode(c)}}


class CommandFailed(subprocess.CalledProcessError):
    """The command exited non-zero or was killed, and the caller asked for `check=True`.
    A subprocess.CalledProcessError (`returncode`, `cmd`, `output`/`stdout`, `stderr`), with
    the whole Result as `result`."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.returncode, result.args, result.stdout, result.stderr)
        self.result = result


class CommandTimedOut(CommandFailed, subprocess.TimeoutExpired):
    """The command's timeout killed it, and the caller asked for `check=True`: both a
    CommandFailed (returncode -9) and a subprocess.TimeoutExpired (`timeout` in seconds), so
    code written for subprocess.run catches it either way."""

    def __init__(self, result: Result) -> None:
        super().__init__(result)
        self.timeout = result.timeout if result.timeout is not None else result.duration

    def __str__(self) -> str:
        return subprocess.TimeoutExpired.__str__(self)


def _signal_name(number: int | None) -> str | None:
    if not number:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:  # real-time signals have no name of their own
        return f"SIG{number}"
