"""Typed errors. Every refusal carries a stable reason code and a CLI exit code.

Messages name files, keys and variable names; they never carry a secret, an environment
value or a SID (a mistyped policy value is shown, cut short, so the user can find it).
"""

from __future__ import annotations

import errno

from stockade.visibletext import visible

EXIT_USAGE = 2
EXIT_SETUP = 70
EXIT_START = 71


class StockadeError(Exception):
    """Base of every error Stockade raises on purpose."""

    exit_code = EXIT_SETUP
    listing = False  # whether the message's newlines are its own, one listed item a line

    def __init__(self, code: str, message: str) -> None:
        # A message may quote what a sandboxed command chose (a path, a link's text: issue 29
        # T2); every reader (the CLI's line, the API's text, --json, a session) gets it with
        # what a terminal would act on escaped, a newline too unless it is the listing's.
        lines = message.split("\n") if self.listing else [message]
        message = "\n".join(visible(line) for line in lines)
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple:
        # Rebuilt from its state, never by its class's __init__ again, whose arguments are
        # not what `args` holds (a Ray task's error crosses processes as a pickle)
        # (an OSError's errno and strerror are not in its __dict__: its __new__ sets them)
        made = (self.errno, self.strerror) if isinstance(self, OSError) else (self.code,
                                                                              self.message)
        return _rebuilt, (type(self), made, self.args, dict(vars(self)))


def _rebuilt(cls: type[StockadeError], made: tuple, args: tuple,
             state: dict) -> StockadeError:
    error = cls.__new__(cls, *made)  # (StartError's __new__ takes two arguments)
    error.args = args
    vars(error).update(state)
    return error


class PolicyError(StockadeError):
    """The policy document is invalid. `location` is `file: key` (either may be empty)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, file: str = "", key: str = "",
                 code: str = "policy_invalid") -> None:
        self.file = file
        self.key = key
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(code, f"{where}: {message}" if where else message)


class RequestError(StockadeError):
    """A serialised launch request is malformed, of another version, or too large."""

    def __init__(self, message: str) -> None:
        super().__init__("request_invalid", message)


class UsageError(StockadeError):
    """The caller used the API or CLI wrongly (not a policy problem)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__("usage", message)


class UnavailableError(StockadeError):
    """The backend cannot run on this host (e.g. `userns_unavailable`)."""


class UnenforceableError(StockadeError):
    """The backend runs here but cannot enforce part of the policy."""

    def __init__(self, capability: str, message: str) -> None:
        self.capability = capability
        super().__init__(f"unenforceable:{capability}", message)


class SetupError(StockadeError):
    """Setting the sandbox up failed at `stage`; the command never ran."""

    def __init__(self, code: str, message: str, stage: str = "") -> None:
        self.stage = stage
        super().__init__(code, message)


class BrokerError(SetupError):
    """The Windows launch broker refused its manifest or did not answer (a `broker_*` code,
    stockade/windows/broker.py): nothing was launched."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, stage="broker")


class StartError(StockadeError):
    """The sandbox was ready but the command could not be started. A `command_not_found` one
    is a CommandNotFound, whichever backend raises it."""

    exit_code = EXIT_START

    def __new__(cls, code: str, message: str) -> StartError:
        if cls is StartError and code == "command_not_found":
            cls = CommandNotFound
        return super().__new__(cls, code, message)


class CommandNotFound(StartError, FileNotFoundError):
    """The command's program does not exist in the sandbox: also a FileNotFoundError, as
    subprocess raises for a missing program (`except FileNotFoundError` catches both)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.errno, self.strerror = errno.ENOENT, message


class ChangesError(StockadeError):
    """A copy-on-write workspace's changes cannot be shown, applied or discarded as asked
    (`changes_not_found`, `changes_busy`: its run is still going, `changes_conflict`: the
    workspace changed on the host since the run started, `changes_refused`: a change the
    policy never lets land, such as one under a protected name, `changes_home_config`: a
    change to the home's configuration, landed only when asked)."""

    exit_code = 1
    listing = True  # (changeapply.refuse: one change a line)

    def __init__(self, code: str, message: str, conflicts: tuple[str, ...] = ()) -> None:
        super().__init__(code, message)
        self.conflicts = conflicts
