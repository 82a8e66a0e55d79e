"""`stockade run --ask`: the proxy's questions (stockade/net/approve.py) put to the person at
the caller's terminal, `/dev/tty`, opened afresh for each: never the sandbox's stdio, which
the command owns.

The command may share that terminal for its output, and so erase the question and show one of
its own (another host, "type r"). So the answer binds to what Stockade asked: each question
shows a random code beside the real host and port, and only that code typed with the choice
allows; what was typed before the question is discarded first, and the host is shown with
every control character escaped (it was chosen inside the sandbox).
"""

from __future__ import annotations

import os
import secrets
import select
import termios

from stockade.errors import UsageError
from stockade.net.approve import ALLOW_ONCE, ALLOW_RUN, DENY, Approval, Ask
from stockade.visibletext import visible

_ANSWERS = {"o": ALLOW_ONCE, "once": ALLOW_ONCE, "r": ALLOW_RUN, "run": ALLOW_RUN}
_CODE_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # (no 0/o, 1/l/i to misread)
_CODE_LENGTH = 5


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
            code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(_CODE_LENGTH))
            termios.tcflush(fd, termios.TCIFLUSH)  # (keys typed before it answer nothing)
            # (the host was chosen inside the sandbox: shown with what a terminal would act on
            # escaped)
            os.write(fd, (f"\nstockade: the command asks to reach "
                          f"{visible(question.host)}:{question.port}, which network.allow "
                          f"leaves out ({question.reason}{needs}). Type 'o {code}' to allow "
                          f"it once, 'r {code}' for the run, anything else to deny "
                          f"({timeout:g}s): ").encode())
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                os.write(fd, b"\nstockade: no answer: denied\n")
                return DENY
            line = os.read(fd, 64).decode("utf-8", "replace")
        finally:
            os.close(fd)
        return answer_of(line, code)

    return Approval(ask, timeout)


def answer_of(line: str, code: str) -> str:
    """What a typed `line` answers to the question that showed `code`: the choice allows only
    with the code (a question the command printed itself cannot know it)."""
    choice, _, typed = line.strip().lower().partition(" ")
    if typed.strip() != code:
        return DENY
    return _ANSWERS.get(choice, DENY)
