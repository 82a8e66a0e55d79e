"""Every refusal of the Linux backend points to `stockade doctor` (doctor.py), which names the
cause and the remedy. Apart from doctor.py, which imports the backend to probe it."""

from __future__ import annotations

DOCTOR = "run `stockade doctor` for the cause and the remedy"


def hint(message: str) -> str:
    """`message`, pointing to `stockade doctor` (once)."""
    return message if DOCTOR in message else f"{message}; {DOCTOR}"
