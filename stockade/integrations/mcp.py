"""`stockade mcp`: a Model Context Protocol server (the official `mcp` SDK) whose tools run in
Stockade, over stdio or streamable HTTP on loopback.

What a client gets: `run` (an argv; a shell string only with `shell: true`; cwd in the
workspace, a timeout that can only shorten the policy's, stdin), `read_file`, `write_file` and
`list_dir` (performed inside the sandbox, confined to the workspace, never following a link),
and warm sessions (`session_start`, `session_exec`, `session_stop`: at most MAX_SESSIONS
sandboxes of its own, each over the same workspace and policy). Every result is structured:
exit code, output within `limits.output`, `timed_out`, and `denials`, each with the `grant`
that would have allowed it, so the host application can ask its user and restart the server
with a wider policy.

What it cannot ask for: anything that widens the policy. The policy and workspace are fixed
when the server starts (`--preset`/`--policy`, `--workspace`); no tool takes roots, network
or limits. The `run` tool and session 0 share one warm sandbox; each session is another.

With `--ask` (network allowlist), a destination network.allow leaves out is put to the client
that made the call, while its command runs, through MCP elicitation (a form: once, for the
run, or deny; no answer within the Workspace's `approve_timeout` denies it): the answer is an
approval as stockade.run's `approve` gives (net/approve.py), for that call's command only,
and lifts no address check and no network.deny pattern. A client that did not declare the
`elicitation` capability, or whose connection cannot carry a server's request (the 2026-07-28
protocol's stateless calls), is not asked: the destination is denied, and the result says
why, with the grant."""

from __future__ import annotations

import inspect
import json
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.session import ServerSession
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from stockade.errors import StockadeError, UsageError
from stockade.integrations.workspace import FileError, Outcome, Workspace
from stockade.launch.denials import Denial, denial_lines
from stockade.net.approve import ALLOW_ONCE, ALLOW_RUN, DENY, Ask
from stockade.visibletext import visible

MAX_SESSIONS = 8
LOOPBACK = ("127.0.0.1", "::1", "localhost")

INSTRUCTIONS = ("Runs commands and file operations in a Stockade sandbox over one workspace. "
                "Results carry `denials`: what the sandbox stopped, each with the policy "
                "`grant` that would allow it; the policy itself cannot be changed from here.")


class Sessions:
    """The warm sessions a client started: Workspaces by id, at most MAX_SESSIONS, each as
    `like` (its policy, workspace and approvals)."""

    def __init__(self, like: Workspace) -> None:
        self._like = like
        self._open: dict[str, Workspace] = {}
        self._lock = threading.Lock()

    def start(self) -> str:
        with self._lock:
            if len(self._open) >= MAX_SESSIONS:
                raise UsageError(f"{MAX_SESSIONS} sessions are open: stop one first")
            name = secrets.token_hex(4)
            like = self._like
            self._open[name] = Workspace(like.policy, workspace=like.root,
                                         approvals=like.approvals,
                                         approve_timeout=like.approve_timeout)
        self._open[name].start()
        return name

    def get(self, name: str) -> Workspace:
        with self._lock:
            if name not in self._open:
                raise UsageError(f"no session {name!r} (start one with session_start)")
            return self._open[name]

    def stop(self, name: str) -> None:
        with self._lock:
            workspace = self._open.pop(name, None)
        if workspace is None:
            raise UsageError(f"no session {name!r}")
        workspace.close()

    def close(self) -> None:
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for workspace in opened:
            workspace.close()


def build_server(workspace: Workspace) -> tuple[MCPServer, Sessions]:
    """The server around `workspace`, and its sessions (close both when it stops)."""
    server = MCPServer("stockade", instructions=INSTRUCTIONS, log_level="WARNING")
    sessions = Sessions(workspace)

    @server.tool(description="Run a command in the sandbox. `argv` is a list of words; a "
                 "single string runs with /bin/sh -c only when `shell` is true. `cwd` is "
                 "relative to the workspace; `timeout` (seconds) can only shorten the "
                 "policy's; `stdin` is the command's input.")
    async def run(argv: list[str] | str, shell: bool = False, cwd: str | None = None,
                  timeout: float | None = None, stdin: str | None = None,
                  ctx: Context | None = None) -> CallToolResult:
        async def command() -> dict:
            return await _asking(workspace, ctx, lambda approve: workspace.aexec(
                argv, shell=shell, cwd=cwd, timeout=timeout, input=stdin, approve=approve))
        return await _call(command)

    @server.tool(description="Read a file of the workspace (text; undecodable bytes are "
                 "replaced).")
    async def read_file(path: str) -> CallToolResult:
        return await _call(lambda: {"path": workspace.resolve(path), "content":
                                    workspace.read_file(path).decode("utf-8", "replace")})

    @server.tool(description="Write a text file in the workspace (parent directories made).")
    async def write_file(path: str, content: str) -> CallToolResult:
        def write() -> dict:
            workspace.write_file(path, content)
            return {"path": workspace.resolve(path), "written": len(content.encode())}
        return await _call(write)

    @server.tool(description="List a directory of the workspace.")
    async def list_dir(path: str = ".") -> CallToolResult:
        return await _call(lambda: {"path": workspace.resolve(path), "entries": [
            {"name": e.name, "kind": e.kind, "size": e.size} for e in workspace.list_dir(path)]})

    @server.tool(description=f"Start a warm session: a sandbox of its own over the same "
                 f"workspace and policy (at most {MAX_SESSIONS}). Returns its id.")
    async def session_start() -> CallToolResult:
        return await _call(lambda: {"session": sessions.start()})

    @server.tool(description="Run a command in a warm session (arguments as for `run`).")
    async def session_exec(session: str, argv: list[str] | str, shell: bool = False,
                           cwd: str | None = None, timeout: float | None = None,
                           stdin: str | None = None,
                           ctx: Context | None = None) -> CallToolResult:
        async def command() -> dict:
            opened = sessions.get(session)
            return await _asking(opened, ctx, lambda approve: opened.aexec(
                argv, shell=shell, cwd=cwd, timeout=timeout, input=stdin, approve=approve))
        return await _call(command)

    @server.tool(description="Stop a warm session: everything in its sandbox is killed.")
    async def session_stop(session: str) -> CallToolResult:
        def stop() -> dict:
            sessions.stop(session)
            return {"session": session, "stopped": True}
        return await _call(stop)

    return server, sessions


class Question(BaseModel):
    """What `--ask` asks the client to fill in (MCP elicitation, form mode)."""

    choice: Literal["once", "run", "deny"] = Field(
        description="once: allow this one connection; run: allow this host and port for the "
                    "rest of this command (this tool call); deny: refuse it")


_CHOICES = {"once": ALLOW_ONCE, "run": ALLOW_RUN}


class Asking:
    """One tool call's questions (`--ask`): each put to the client that made the call, through
    MCP elicitation, where it can be; otherwise denied unasked (`unasked`; `why_not` says
    why)."""

    def __init__(self, ctx: Context, timeout: float) -> None:
        self.ctx, self.timeout = ctx, timeout
        self.why_not = why_not_asked(ctx.request_context.session)
        self.unasked: list[Ask] = []

    async def ask(self, ask: Ask) -> str:
        """The client's answer: ALLOW_ONCE, ALLOW_RUN or DENY (declined, cancelled, an answer
        that is not one of the choices, none within the timeout)."""
        with anyio.move_on_after(self.timeout):  # (the question ends with its bound)
            answered = await self.ctx.elicit(question(ask, self.timeout), Question)
            if answered.action == "accept":
                return _CHOICES.get(answered.data.choice, DENY)
        return DENY

    def deny_unasked(self, ask: Ask) -> str:
        self.unasked.append(ask)
        return DENY

    def said(self) -> list[dict]:
        """Each destination denied unasked, once, with why and the grant that allows it."""
        shown = dict.fromkeys((visible(a.host), a.port) for a in self.unasked)
        return [{"host": host, "port": port, "why": self.why_not,
                 "grant": f"network.allow {host}:{port}"} for host, port in shown]


def why_not_asked(session: ServerSession) -> str | None:
    """Why the client of `session` cannot be asked through elicitation (None: it can)."""
    capabilities = session.client_capabilities
    elicitation = None if capabilities is None else capabilities.elicitation
    if elicitation is None:
        return "this client does not support MCP elicitation (it declared no `elicitation` " \
               "capability)"
    if elicitation.form is None and elicitation.url is not None:
        return "this client supports only URL elicitation, not the form the question is"
    if not session.can_send_request:
        return "this client's connection cannot carry a server's request (the 2026-07-28 " \
               "protocol's stateless calls)"
    return None


def question(ask: Ask, timeout: float) -> str:
    """The elicitation's words (the host was chosen inside the sandbox: shown escaped)."""
    needs = f"; it would use credential {', '.join(ask.credentials)}" if ask.credentials else ""
    return (f"The command in the Stockade sandbox asks to reach {visible(ask.host)}:{ask.port}, "
            f"which the policy's network.allow leaves out ({ask.reason}{needs}). Allow it once "
            f"(this connection), for the run (this command, until it ends), or deny it? No "
            f"answer in {timeout:g}s denies it. An approval lifts no address check and no "
            "network.deny pattern.")


async def _asking(workspace: Workspace, ctx: Context | None,
                  command: Callable[[Callable[[Ask], object] | None], Awaitable[Outcome]]
                  ) -> dict:
    """`command(approve)`'s Outcome as JSON: with `--ask` (a Workspace with approvals), its
    destinations outside network.allow put to this call's client, or denied unasked and said
    (`not_asked`)."""
    if not workspace.approvals or ctx is None:
        return (await command(None)).to_json()
    asking = Asking(ctx, workspace.approve_timeout)
    value = (await command(asking.deny_unasked if asking.why_not else asking.ask)).to_json()
    if asking.unasked:
        value["not_asked"] = asking.said()
    return value


def serve(workspace: Workspace, *, http: int | None = None, host: str = "127.0.0.1") -> None:
    """Serve until the client leaves (stdio) or the process is stopped (HTTP on loopback)."""
    if http is not None and host not in LOOPBACK:
        raise UsageError(f"--host {host}: the HTTP transport binds to loopback only")
    server, sessions = build_server(workspace)
    try:
        if http is None:
            server.run("stdio")
        else:
            server.run("streamable-http", host=host, port=http)
    finally:
        sessions.close()
        workspace.close()


async def _call(work: Any) -> CallToolResult:
    """`work()` in a worker thread (a sandbox call blocks; a command's is awaited, so that a
    cancelled call, or a client gone, kills it), as a tool result: its structured value, or a
    typed error (code, message, grant) for a refusal or a mistake."""
    try:
        value = await work() if inspect.iscoroutinefunction(work) else \
            await anyio.to_thread.run_sync(work)
    except FileError as exc:
        return _error({"error": exc.code, "message": exc.message, "grant": exc.grant})
    except StockadeError as exc:
        return _error({"error": exc.code, "message": exc.message, "grant": None})
    return CallToolResult(content=[TextContent(type="text", text=_summary(value))],
                          structured_content=value)


def _error(body: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))],
                          structured_content=body, is_error=True)


def _summary(value: dict) -> str:
    """The text a client that ignores structured content shows (what the sandbox stopped
    or cut in words, with the grant that would allow it)."""
    if "exit_code" in value:
        lines = [f"exit code {value['exit_code']}" + (" (timed out)" if value["timed_out"]
                                                       else "")]
        lines += [value["stdout"], value["stderr"]]
        lines += denial_lines(Denial(**d) for d in value["denials"])
        lines += [f"stockade: not asked about {d['host']}:{d['port']}: {d['why']} (stockade mcp "
                  f"--ask); the policy grant that would allow it: {d['grant']}"
                  for d in value.get("not_asked", ())]
        return "\n".join(line for line in lines if line)
    return json.dumps(value)
