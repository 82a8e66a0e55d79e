"""`stockade run --ask`: the proxy's questions (stockade/net/approve.py) put to the person at
the caller's terminal, `/dev/tty`, opened afresh for each: never the sandbox's stdio, which
the command owns.
"""

from __future__ import annotations

import os
import select

from stockade.errors import UsageError
from stockade.net.approve import ALLOW_ONCE, ALLOW_RUN, DENY, Approval, Ask
from stockade.visibletext import visible

_ANSWERS = {"o": ALLOW_ONCE, "once": ALLOW_ONCE, "r": ALLOW_RUN, "run": ALLOW_RUN}


def terminal_approval(timeout: float) -> Approval:
    """An Approval asking at the controlling terminal; UsageError when there is none."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        raise UsageError("--ask needs a terminal to ask at (/dev/tty); there is none "
                         "here") from None

    def ask(question: Ask) -> str:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        try:
            needs = (f"; it would use credential {', '.join(question.credentials)}"
                     if question.credentials else "")
            # (the host was chosen inside the sandbox: shown with what a terminal would act on
            # escaped)
            os.write(fd, (f"\nstockade: the command asks to reach "
                          f"{visible(question.host)}:{question.port}, which network.allow "
                          f"leaves out ({question.reason}{needs}). Allow it [o]nce, for the "
                          f"[r]un, or [N]o? ({timeout:g}s) ").encode())
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                os.write(fd, b"\nstockade: no answer: denied\n")
                return DENY
            line = os.read(fd, 64).decode("utf-8", "replace").strip().lower()
        finally:
            os.close(fd)
        return _ANSWERS.get(line, DENY)

    return Approval(ask, timeout)
