"""`stockade run --ask`: the proxy's questions (stockade/net/approve.py) put to the person at
the caller's terminal, `/dev/tty`, opened afresh for each: never the sandbox's stdio, which
the command owns.

The command may share that terminal for its output, and so erase the question, show one of its
own, or write another host over the cells of the real one (it writes to the screen; it cannot
read it). So the answer names what it approves: the person types the host and port they read,
and only the host and port Stockade asked about allows; an answer naming what the command made
the screen show is a denial. What was typed before the question is discarded first, the
command's colours are reset before the question, the host is shown with every control
character escaped (it was chosen inside the sandbox), and the decision is said after it.
"""

from __future__ import annotations

import os
import select
import termios

from stockade.errors import UsageError
from stockade.net.approve import ALLOW_ONCE, ALLOW_RUN, DENY, Approval, Ask
from stockade.visibletext import RESET, visible

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
            asked = f"{visible(question.host)}:{question.port}"
            termios.tcflush(fd, termios.TCIFLUSH)  # (keys typed before it answer nothing)
            os.write(fd, (f"{RESET}\nstockade: the command asks to reach {asked}, which "
                          f"network.allow leaves out ({question.reason}{needs}). Type 'o {asked}' "
                          f"to allow it once, 'r {asked}' for the run, anything else to deny "
                          f"({timeout:g}s): ").encode())
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                os.write(fd, f"{RESET}\nstockade: no answer: {asked} denied\n".encode())
                return DENY
            answer = answer_of(os.read(fd, 512).decode("utf-8", "replace"), asked)
            said = {ALLOW_ONCE: "approved once", ALLOW_RUN: "approved for the run"}
            os.write(fd, f"{RESET}stockade: {asked} {said.get(answer, 'denied')}\n".encode())
        finally:
            os.close(fd)
        return answer

    return Approval(ask, timeout)


def answer_of(line: str, asked: str) -> str:
    """What a typed `line` answers to the question about `asked` (HOST:PORT): the choice allows
    only with that host and port typed (what the person read, which the command may have
    written over the real one)."""
    choice, _, typed = line.strip().lower().partition(" ")
    if typed.strip() != asked.lower():
        return DENY
    return _ANSWERS.get(choice, DENY)
