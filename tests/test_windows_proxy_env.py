"""The proxy variables of a Windows allowlist launch (attack round on issue 36, E1-E3): Windows
holds one variable per name whatever its case, and its environment block refuses two names
differing only in case, so each proxy variable is set once there; Linux keeps both cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.request import LaunchRequest, NetworkSpec, PathGrant
from stockade.net import env as proxyenv
from stockade.session import boot
from stockade.vm import wsb
from stockade.windows import broker, envblock, netfence, process, rules
from stockade.windows.manifest import Context, Control, Manifest

PY = "C:\\py\\python.exe"


def allowlist_env(tmp_path) -> tuple[tuple[str, str], ...]:
    policy = stockade.preset("workspace-write")
    policy = replace(policy, network=replace(policy.network, mode="allowlist",
                                             allow=("pypi.org",)))
    return compile_policy(policy, ["true"], CompileContext.current(tmp_path)).env


def windows_request(env) -> LaunchRequest:
    return LaunchRequest(argv=(PY, "-c", "1"), cwd="C:\\ws", env=env,
                         read=(PathGrant("C:\\py", "C:\\py"),),
                         write=(PathGrant("C:\\ws", "C:\\ws"),),
                         network=NetworkSpec("allowlist", ("pypi.org",)), request_id="e1")


def test_linux_keeps_both_cases_of_each_proxy_variable(tmp_path, monkeypatch):
    monkeypatch.setattr(proxyenv, "CASE_INSENSITIVE", False)
    names = {name for name, _ in allowlist_env(tmp_path)}
    assert {"HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"} <= names


def test_a_windows_allowlist_launch_compiles_to_an_environment_the_check_accepts(
        tmp_path, monkeypatch):
    """E1: compiled on Windows, each proxy variable once; the Windows check passes it (it
    refused every allowlist launch as unenforceable:env)."""
    monkeypatch.setattr(proxyenv, "CASE_INSENSITIVE", True)
    env = allowlist_env(tmp_path)
    names = [name for name, _ in env]
    assert "HTTP_PROXY" in names and "http_proxy" not in names
    rules.check(windows_request(env), None, fence=lambda: None)


def test_the_launch_network_sets_the_proxy_once_over_any_case_of_its_name():
    """E2: the host's own proxy variables for the broker replace a variable of their name in
    another case (the broker could not build the block)."""
    request = windows_request((("PATH", "C:\\py"), ("http_proxy", "http://elsewhere:1")))
    with netfence.LaunchNetwork(request) as network:
        env = network.environment(request.env)
    block = envblock.environment_block(env)
    assert "elsewhere" not in block and f"HTTP_PROXY=http://127.0.0.1:{network.port}" in block


def test_a_windows_sandbox_command_env_is_one_windows_can_hold(tmp_path, monkeypatch):
    """E3: the guest's command environment (compiled env + the guest's proxy address) builds
    a block: the guest agent's spawner refused it (start_failed)."""
    monkeypatch.setattr(proxyenv, "CASE_INSENSITIVE", False)  # (even a both-case env)
    env = allowlist_env(tmp_path) + (("PATH", "C:\\py"),)

    class Guest:
        proxy_address = ("172.20.1.1", 50123)

    class Handle:
        guest = Guest()

    session = boot.Session(windows_request(env), Handle(), None, {})  # type: ignore[arg-type]
    variables = wsb.command_env(windows_request(env), session)
    block = envblock.environment_block(tuple(variables.items()))
    assert "HTTP_PROXY=http://172.20.1.1:50123\0" in block and "3128" not in block


@pytest.mark.parametrize("env", [(("PATH", "C:\\a"), ("Path", "C:\\b")),
                                 (("A", "x\0y"),)])
def test_a_broker_refuses_a_request_windows_cannot_hold_typed(env):
    """E2: a request whose block cannot be built is a typed refusal, never an exception out
    of broker.answer (the host saw only broker_failed)."""
    request = windows_request(env)
    context = Context("S-1-15-2-1-2-3-4-5-6-7", (), "WinSta0\\stockade-" + "5" * 24,
                      "C:\\t", 0x104, (0x10, 0x14, 0x18))
    nonce = "ab" * 32
    data = Manifest.for_launch(5150, nonce, request, context).encode()
    frame = Control(nonce, request.digest, "C:\\m", "0000abcd-0000000000000001").encode()
    made = []
    one = broker.Broker(5150, lambda path, file_id, limit: data,
                        lambda launch: made.append(launch) or process.Created(1, 2, 3, 4),
                        resolve=lambda r: PY)
    said = broker.answer(one, frame)
    assert (said.outcome, said.body["code"], made) == ("refused", "broker_bad_request", [])


def test_a_linux_guest_of_a_windows_host_gets_both_cases(monkeypatch):
    """A qemu guest is Linux whatever the host: curl reads only `http_proxy`."""
    from stockade.vm import qemu

    monkeypatch.setattr(proxyenv, "CASE_INSENSITIVE", True)
    env = qemu.guest_environment(replace(windows_request(()), argv=("true",)))
    assert {"HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"} <= set(env)
