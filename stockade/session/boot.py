"""Starting a warm sandbox: the guest agent launched as a real sandbox's command, then the
handshake (the secret out of band, then `hello` both ways).

To run at all, the agent needs to read the Python interpreter (its installation prefix,
`sys.base_prefix`) and Stockade's own package directory: a warm sandbox's policy is the caller's
plus those two read roots, and nothing else.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, replace

from stockade.errors import StockadeError, UnenforceableError, UsageError
from stockade.launch.backend import Handle, Stdio
from stockade.launch.compile import CompileContext, compile_policy, with_read_roots
from stockade.launch.manager import SandboxManager
from stockade.launch.request import LaunchRequest
from stockade.net.approve import Approval
from stockade.policy.model import Policy
from stockade.session import protocol
from stockade.session.channel import Channel
from stockade.session.errors import SessionError
from stockade.session.protocol import Message

BOOT_TIMEOUT = 30.0  # seconds from launch to the agent's hello
BOOT_ATTEMPTS = 3
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# The package is loaded from its own directory: its parent need not be readable (Python cannot
# import from a sys.path entry it cannot list).
_BOOT = ("import sys, importlib.util as u; p = sys.argv[1]; "
         "s = u.spec_from_file_location('stockade', p + '/__init__.py', "
         "submodule_search_locations=[p]); m = u.module_from_spec(s); "
         "sys.modules['stockade'] = m; s.loader.exec_module(m); "
         "from stockade.session.agent import main; sys.exit(main())")


@dataclass
class Session:
    """A booted sandbox with its agent: the launch, its handle, the channel and its hello."""

    request: LaunchRequest
    handle: Handle
    channel: Channel
    hello: dict
    commands: int = 0  # the last command number sent (a kept guest's next execution goes on)


def agent_roots() -> tuple[str, ...]:
    """What the agent itself must read: the interpreter's prefix (and the interpreter's own
    directory when it lies elsewhere) and Stockade's package directory."""
    prefix = os.path.realpath(sys.base_prefix)
    interpreter = os.path.dirname(os.path.realpath(sys.executable))
    roots = [prefix, PACKAGE_DIR]
    if not (interpreter + "/").startswith(prefix + "/"):
        roots.append(interpreter)
    return tuple(roots)


def agent_request(policy: Policy, ctx: CompileContext) -> LaunchRequest:
    """The launch of the agent under `policy` plus `agent_roots()`, with no wall-clock limit
    (the session lives until it is closed; each command has its own timeout)."""
    return agent_launch(compile_policy(policy, _agent_argv(), ctx, stdin="null"))


def agent_launch(request: LaunchRequest) -> LaunchRequest:
    """The agent's launch for a compiled `request` (a command's): its roots, network and
    limits, plus `agent_roots()` readable, the agent as the command, stdin null, no wall-clock
    limit, and a request id of its own. Credentials are refused: each command of a session is
    compiled with placeholders of its own, which its proxy would not know."""
    if request.network.credentials:
        raise UnenforceableError("network.credentials", "network.credentials are kept for "
                                 "one launch (stockade.run, stockade run), not yet in a warm "
                                 "Sandbox or session")
    request = with_read_roots(request, agent_roots())
    return replace(request, argv=tuple(_agent_argv()), stdin="null",
                   limits=replace(request.limits, timeout=None),
                   request_id=secrets.token_hex(16))


def _agent_argv() -> list[str]:
    return [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", _BOOT, PACKAGE_DIR]


def greeting(nonce: bytes, keep_detached: bool) -> Message:
    """The host's hello: the session's secret, and whether the agent keeps what commands
    detach (docs/sessions.md); a command never sends it (it cannot reach the channel)."""
    return Message("hello", body={"nonce": nonce.hex(), "keep_detached": keep_detached})


def boot(policy: Policy, ctx: CompileContext, *, attempts: int = BOOT_ATTEMPTS,
         timeout: float = BOOT_TIMEOUT, request: LaunchRequest | None = None,
         keep_detached: bool = False, approval: Approval | None = None) -> Session:
    """A sandbox whose agent has said hello. A sandbox the host refuses (policy, unavailable,
    unenforceable) raises at once; an agent that fails to answer is retried, `attempts` times
    in all, then `session_boot_failed`. With `approval`, its proxy asks it about
    destinations outside network.allow."""
    if policy.containment != "native":
        raise UsageError(f'containment = "{policy.containment}" does not boot in namespaces '
                         "(stockade.Sandbox picks the VM driver for it)")
    request = request or agent_request(policy, ctx)  # (given: an overlaid one's, see Sandbox)
    backend = SandboxManager("linux", "require").select(request)
    if approval is not None:
        if request.network.mode != "allowlist":
            raise UsageError(f"approve= asks about what network.allow leaves out: it needs "
                             f'network.mode "allowlist" (the policy\'s is '
                             f'"{request.network.mode}")')
        backend = backend.with_approval(approval)
    failures = []
    for _ in range(attempts):
        handle = backend.spawn(request, Stdio(subprocess.PIPE, subprocess.PIPE, subprocess.PIPE))
        try:
            return _handshake(request, handle, timeout, keep_detached)
        except SessionError as exc:
            failures.append(exc.message)
    raise SessionError("session_boot_failed",
                       f"the agent did not start after {attempts} attempts: {failures[-1]}")


def _handshake(request: LaunchRequest, handle: Handle, timeout: float,
               keep_detached: bool) -> Session:
    assert handle.stdin is not None and handle.stdout is not None
    nonce = secrets.token_bytes(protocol.NONCE_SIZE)
    channel = Channel(handle.stdin, handle.stdout, handle.status_reader())
    try:
        os.write(handle.stdin.fileno(), nonce)  # 32 bytes fit an empty pipe: never blocks
        channel.send(greeting(nonce, keep_detached))
        reply = channel.receive(timeout)
        if reply is None:
            raise SessionError("session_boot_failed", f"no hello from the agent in {timeout:g}s")
        if reply.type != "hello":
            raise SessionError("session_boot_failed", f"the agent answered {reply.type}")
    except (StockadeError, OSError) as exc:
        handle.kill()
        channel.close()
        failure = handle.wait().failure  # a sandbox that failed says why, typed
        tail = _tail(handle)
        if failure is not None:
            raise failure from None
        raise SessionError("session_boot_failed", f"{exc} ({tail})") from None
    return Session(request, handle, channel, reply.body)


def _tail(handle: Handle) -> str:
    """The end of what the agent wrote on stderr (it writes only when it fails)."""
    assert handle.stderr is not None
    os.set_blocking(handle.stderr.fileno(), False)
    try:
        text = (handle.stderr.read() or b"")[-400:].decode("utf-8", "replace").strip()
    finally:
        handle.stderr.close()
    return f"agent stderr: {text}" if text else "the agent wrote nothing on stderr"
