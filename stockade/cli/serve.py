"""`stockade serve --agent-sandbox`: serve the in-pod runtime contract of
kubernetes-sigs/agent-sandbox over HTTP (stockade/integrations/agent_sandbox.py is the
server; the standard library's, so no extra is needed)."""

from __future__ import annotations

import argparse
from typing import Any

from stockade.cli.common import add_policy_source, chosen_policy, no_command, subcommand
from stockade.errors import UsageError


def add_serve(commands: Any) -> None:
    parser = subcommand(commands, "serve", _serve,
                        "serve a sandbox runtime over HTTP: with --agent-sandbox, the in-pod "
                        "runtime of kubernetes-sigs/agent-sandbox (the policy is fixed here; "
                        "no request can widen it)",
                        "stockade serve --agent-sandbox --preset workspace-write --workspace .",
                        "stockade serve --agent-sandbox --policy agent.toml --workspace /app "
                        "--host 0.0.0.0 --allow-remote")
    parser.add_argument("--agent-sandbox", action="store_true",
                        help="speak agent-sandbox's runtime contract (its python-runtime's "
                             "HTTP API; the only protocol `serve` has)")
    add_policy_source(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to bind (default 127.0.0.1; beyond loopback only "
                             "with --allow-remote)")
    parser.add_argument("--port", type=int, default=8888,
                        help="the port (default 8888, the contract's; 0: any free one, said "
                             "on stderr)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host beyond loopback (the server has no authentication "
                             "of its own: in a pod, the pod network and the router guard it)")
    parser.add_argument("--max-upload", metavar="BYTES", type=int,
                        help="the largest file an upload may carry and a download may return "
                             "(default 64 MiB)")
    parser.add_argument("--max-concurrent", metavar="N", type=int,
                        help="commands that may run at once, each in a sandbox of its own "
                             "(default 8); one more is refused at once, 503 busy with "
                             "Retry-After (health and file operations never wait for them)")
    parser.add_argument("--max-connections", metavar="N", type=int,
                        help="connections open at once (default 256, and fewer than the "
                             "descriptor limit allows); one more is answered 503 busy and "
                             "closed")


def _serve(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    if not args.agent_sandbox:
        raise UsageError("stockade serve needs the protocol to speak: --agent-sandbox")
    from stockade.integrations import agent_sandbox

    limit = agent_sandbox.DEFAULT_MAX_UPLOAD if args.max_upload is None else args.max_upload
    running = (agent_sandbox.DEFAULT_MAX_CONCURRENT if args.max_concurrent is None
               else args.max_concurrent)
    connections = (agent_sandbox.DEFAULT_MAX_CONNECTIONS if args.max_connections is None
                   else args.max_connections)
    agent_sandbox.serve(chosen_policy(args), workspace=args.workspace, host=args.host,
                        port=args.port, allow_remote=args.allow_remote, max_upload=limit,
                        max_concurrent=running, max_connections=connections)
    return 0
