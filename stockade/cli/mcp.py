"""`stockade mcp`: serve Stockade's tools over the Model Context Protocol (stdio, or
streamable HTTP on loopback); stockade/integrations/mcp.py is the server. The SDK is imported
only when the command runs: it is the `mcp` extra."""

from __future__ import annotations

import argparse
from typing import Any

from stockade.cli import run
from stockade.cli.common import add_policy_source, chosen_policy, no_command, subcommand
from stockade.errors import UnavailableError, UsageError


def add_mcp(commands: Any) -> None:
    parser = subcommand(commands, "mcp", _mcp,
                        "serve a Model Context Protocol server whose tools run in a sandbox "
                        "(the policy is fixed here; no tool call can widen it)",
                        "stockade mcp --preset workspace-write --workspace .",
                        "stockade mcp --policy agent.toml --http 8765",
                        "stockade mcp --policy agent.toml --ask")
    add_policy_source(parser)
    parser.add_argument("--http", metavar="PORT", type=int,
                        help="serve streamable HTTP on loopback at PORT (default: stdio)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the loopback address to bind with --http (default 127.0.0.1)")
    parser.add_argument("--ask", action="store_true",
                        help="network allowlist: while a tool call's command runs, ask the "
                             "client that made the call (MCP elicitation) about each "
                             "destination network.allow leaves out: allow it once, for that "
                             f"command, or not; no answer in {run.ASK_SECONDS:g}s, or a "
                             "client without elicitation, denies it (said in the result, with "
                             "the grant). "
                             "An approval lifts no address check and no network.deny pattern")


def _mcp(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    try:
        from stockade.integrations import mcp
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types", "anyio"):
            raise
        raise UnavailableError("extra_missing", "the MCP server needs the `mcp` package: "
                               "pip install 'stockade[mcp]'") from None
    from stockade.integrations.workspace import Workspace

    if args.http is not None and not 0 < args.http < 65536:
        raise UsageError(f"--http {args.http}: not a port")
    workspace = Workspace(chosen_policy(args), workspace=args.workspace, approvals=args.ask,
                          approve_timeout=run.ASK_SECONDS)
    mcp.serve(workspace, http=args.http, host=args.host)
    return 0
