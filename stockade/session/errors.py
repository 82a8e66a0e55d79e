"""Typed errors of warm sessions: the protocol and the session around it."""

from __future__ import annotations

from stockade.errors import StockadeError


class ProtocolError(StockadeError):
    """A peer broke the session protocol. `code` is one of `protocol.ERROR_CODES`; the
    connection is over once this is raised."""


class SessionError(StockadeError):
    """The warm sandbox could not be started, or was lost (`session_boot_failed`,
    `session_lost`, `session_closed`, `agent_unresponsive`, `busy`, ...)."""


class StartFailure(Exception):
    """An agent could not start a command; `code` is one of protocol.COMMAND_CODES (sent in
    the command's `error`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
