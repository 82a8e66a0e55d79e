"""`stockade mcp`: serve Stockade's tools over the Model Context Protocol (stdio, or
streamable HTTP on loopback); stockade/integrations/mcp.py is the server. The SDK is imported
only when the command runs: it is the `mcp` extra."""

from __future__ import annotations

import argparse
from typing import Any

from stockade.cli.common import add_policy_source, chosen_policy, no_command, subcommand
from stockade.errors import UnavailableError, UsageError


def add_mcp(commands: Any) -> None:
    parser = subcommand(commands, "mcp", _mcp,
                        "serve a Model Context Protocol server whose tools run in a sandbox "
                        "(the policy is fixed here; no tool call can widen it)",
                        "stockade mcp --preset workspace-write --workspace .",
                        "stockade mcp --policy agent.toml --http 8765")
    add_policy_source(parser)
    parser.add_argument("--http", metavar="PORT", type=int,
                        help="serve streamable HTTP on loopback at PORT (default: stdio)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the loopback address to bind with --http (default 127.0.0.1)")


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
    workspace = Workspace(chosen_policy(args), workspace=args.workspace)
    mcp.serve(workspace, http=args.http, host=args.host)
    return 0
