"""The proxy's decision log: JSON lines on disk, denials also kept in memory for the result.

One entry per request: time (UTC, ISO 8601), request_id, protocol (`connect`, `http`, `socks5`,
and `https` for a request read inside an intercepted tunnel), host, port, decision (`allow`,
`deny`, `error` for an allowed request whose resolution or dial failed), rule (the pattern that
decided, or null), reason (a stable code), message (for people) and, when an address was
judged, address.

Denials and the caller's approvals (reason `approved_once`, `approved_for_run`: approve.py) are
always recorded, and kept in memory; other decisions only with `log_all`. The in-memory list
keeps the first `max_kept` of them (a child looping on denied requests must not grow the proxy
without bound); `dropped` counts the rest, which still reach the file.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from typing import Any


class DecisionLog:
    """Thread-safe; the file is created 0600 and appended to, one flushed line per entry."""

    def __init__(self, request_id: str, path: str | None = None, *, log_all: bool = False,
                 max_kept: int = 10_000) -> None:
        self.request_id = request_id
        self.log_all = log_all
        self.max_kept = max_kept
        self.dropped = 0
        self._denials: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = None
        if path is not None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8")

    def record(self, *, protocol: str, host: str, port: int, decision: str, reason: str,
               message: str, rule: str | None = None, address: str | None = None) -> None:
        approved = decision == "allow" and reason.startswith("approved")
        if decision != "deny" and not self.log_all and not approved:
            return
        entry: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "request_id": self.request_id, "protocol": protocol, "host": host, "port": port,
            "decision": decision, "rule": rule, "reason": reason, "message": message,
        }
        if address is not None:
            entry["address"] = address
        with self._lock:
            if decision == "deny" or approved:
                if len(self._denials) < self.max_kept:
                    self._denials.append(entry)
                else:
                    self.dropped += 1
            if self._file is not None:
                self._file.write(json.dumps(entry, ensure_ascii=True) + "\n")
                self._file.flush()

    def denials(self) -> list[dict[str, Any]]:
        """A copy of the denials (and approvals) kept so far, oldest first."""
        with self._lock:
            return [dict(entry) for entry in self._denials]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
