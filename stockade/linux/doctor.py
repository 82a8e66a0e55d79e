"""`stockade doctor`: why the Linux backend is unavailable or weakened on this host, and the
exact remedy for each cause. (Filled in below; `hint` is what every refusal of the backend
appends.)"""

from __future__ import annotations

DOCTOR = "run `stockade doctor` for the cause and the remedy"


def hint(message: str) -> str:
    """`message`, pointing to `stockade doctor` (once)."""
    return message if DOCTOR in message else f"{message}; {DOCTOR}"
