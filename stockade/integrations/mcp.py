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
or limits. The `run` tool and session 0 share one warm sandbox; each session is another."""

from __future__ import annotations

import inspect
import json
import secrets
import threading
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

from stockade.errors import StockadeError, UsageError
from stockade.integrations.workspace import FileError, Workspace
from stockade.launch.denials import Denial, denial_lines
from stockade.policy import Policy

MAX_SESSIONS = 8
LOOPBACK = ("127.0.0.1", "::1", "localhost")

INSTRUCTIONS = ("Runs commands and file operations in a Stockade sandbox over one workspace. "
                "Results carry `denials`: what the sandbox stopped, each with the policy "
                "`grant` that would allow it; the policy itself cannot be changed from here.")


class Sessions:
    """The warm sessions a client started: Workspaces by id, at most MAX_SESSIONS."""

    def __init__(self, policy: Policy, root: str) -> None:
        self._policy, self._root = policy, root
        self._open: dict[str, Workspace] = {}
        self._lock = threading.Lock()

    def start(self) -> str:
        with self._lock:
            if len(self._open) >= MAX_SESSIONS:
                raise UsageError(f"{MAX_SESSIONS} sessions are open: stop one first")
            name = secrets.token_hex(4)
            self._open[name] = Workspace(self._policy, workspace=self._root)
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
    sessions = Sessions(workspace.policy, workspace.root)

    @server.tool(description="Run a command in the sandbox. `argv` is a list of words; a "
                 "single string runs with /bin/sh -c only when `shell` is true. `cwd` is "
                 "relative to the workspace; `timeout` (seconds) can only shorten the "
                 "policy's; `stdin` is the command's input.")
    async def run(argv: list[str] | str, shell: bool = False, cwd: str | None = None,
                  timeout: float | None = None, stdin: str | None = None) -> CallToolResult:
        async def command() -> dict:
            return (await workspace.aexec(argv, shell=shell, cwd=cwd, timeout=timeout,
                                          input=stdin)).to_json()
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
                           stdin: str | None = None) -> CallToolResult:
        async def command() -> dict:
            return (await sessions.get(session).aexec(argv, shell=shell, cwd=cwd,
                                                      timeout=timeout, input=stdin)).to_json()
        return await _call(command)

    @server.tool(description="Stop a warm session: everything in its sandbox is killed.")
    async def session_stop(session: str) -> CallToolResult:
        def stop() -> dict:
            sessions.stop(session)
            return {"session": session, "stopped": True}
        return await _call(stop)

    return server, sessions


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
        return "\n".join(line for line in lines if line)
    return json.dumps(value)
