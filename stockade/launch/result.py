"""Result: what one sandboxed run produced."""

from __future__ import annotations

import signal as _signal
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Violation:
    """Something the sandbox stopped or cut short: `kind` is stable (e.g. `limits.timeout`)."""

    kind: str
    detail: str


def network_denials(records: list[dict]) -> list[Violation]:
    """A `network.denied` Violation per denial record of the egress proxy."""
    return [Violation("network.denied", f"{d['protocol']} {d['host']}:{d['port']}: "
                                        f"{d.get('reason') or d.get('rule')}") for d in records]


@dataclass(frozen=True)
class Result:
    exit_code: int | None            # None when the command was killed by a signal
    signal: int | None
    stdout: bytes
    stderr: bytes
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

    @property
    def returncode(self) -> int:
        """The shell convention: the exit code, or 128 + N for a command killed by signal N."""
        if self.exit_code is not None:
            return self.exit_code
        return 128 + (self.signal or 0)

    def to_json(self) -> dict:
        """A JSON-ready summary (output as text, undecodable bytes replaced)."""
        body = asdict(self)
        body["stdout"] = self.stdout.decode("utf-8", "replace")
        body["stderr"] = self.stderr.decode("utf-8", "replace")
        body["signal_name"] = _signal_name(self.signal)
        body["returncode"] = self.returncode
        return body


def _signal_name(number: int | None) -> str | None:
    if not number:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:  # real-time signals have no name of their own
        return f"SIG{number}"
