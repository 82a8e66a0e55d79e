"""Where a change set keeps each write root's overlay layers (stockade/lifecycle/changes.py
makes them; stockade/linux/overlay.py mounts them). Apart from the change sets' machinery, so
that a launch imports only this."""

from __future__ import annotations

import os

CAPABILITY = "filesystem.workspace"
UPPER, WORK = "upper", "work"  # each write root's layers


def layer_dir(changes_dir: str, index: int) -> str:
    """Where the layers of the `index`th write root (in the request's order) lie."""
    return os.path.join(changes_dir, "layers", str(index))
