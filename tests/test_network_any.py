"""network.mode = "any": real sandboxed children in a small internet of the test's own
(tests/networld.py), as root and rootless (the suite runs both ways; rootless, Stockade runs
as the caller's uid in a user namespace nested in the world's, with no privilege at all).

Nothing leaves this machine: the world is network namespaces the test makes, with a public
host on a documentation range, a resolver, a fake metadata service on 169.254.169.254 and a
private host; the "host" around the sandbox has services on its loopback and its own address.
Each test asserts what the child saw and what every server saw: a guarded destination that
was reached would show in the servers' records, whatever the child printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import policy_for, unavailable

import stockade
from stockade.linux import dns, doctor, guard, usernet
from stockade.policy.model import NetworkPolicy

pytestmark = pytest.mark.usefixtures("linux")

WORLD = Path(__file__).with_name("networld.py")
PUBLIC, RESOLVER, METADATA, PRIVATE = "203.0.113.10", "203.0.113.53", "169.254.169.254", \
    "10.9.9.9"
HOST, ROUTER = "198.51.100.2", "198.51.100.1"
SYSTEM_PYTHON = "/usr/bin/python3"  # the child's: inside the read-only preset's roots

# The child: each attempt is printed as one JSON line [what, target, outcome].
PROBE = r"""
import json, socket, sys
def say(*line):
    print(json.dumps(line), flush=True)
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    host, _, port = where.rpartition(":")
    try:
        if kind == "tcp":
            with socket.create_connection((host.strip("[]"), int(port)), timeout=3) as c:
                say(kind, where, c.recv(100).decode().strip())
        elif kind == "udp":
            host = host.strip("[]")
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as u:
                u.settimeout(3)
                u.sendto(b"ping", (host, int(port)))
                say(kind, where, u.recv(100).decode())
        elif kind == "dns":
            say(kind, where, socket.gethostbyname(where))
        elif kind == "dns6":
            say(kind, where, socket.getaddrinfo(where, None, socket.AF_INET6)[0][4][0])
        elif kind == "read":
            with open(where) as f:
                say(kind, where, f.read())
    except OSError as exc:
        say(kind, where, f"error {exc.errno}")
"""

GUARDED = [f"tcp:{METADATA}:80", f"tcp:{PRIVATE}:80", f"udp:{METADATA}:7",
           f"udp:{PRIVATE}:7", "tcp:127.0.0.1:80", f"tcp:{HOST}:80"]
OPEN = [f"tcp:{PUBLIC}:80", f"udp:{PUBLIC}:7", "dns:public.test", f"tcp:{ROUTER}:80"]


def in_world(tmp_path: Path, policy: dict | None, targets: list[str],
             weaken: tuple[str, ...] = (), program: str = PROBE, **world: object) -> dict:
    """Run the probe (or `program`) with `targets` in a sandbox of `policy` (network any unless
    it says otherwise), inside a fresh world (`world`: more of networld.py's spec); what networld.py
    reports, and the attempts parsed."""
    policy = {"version": 1, "preset": "read-only", "network": {"mode": "any"}} | (policy or {})
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    tmp_path.chmod(0o755)
    for path in tmp_path.iterdir():
        path.chmod(0o644)
    spec = {"argv": [sys.executable, str(runner), str(tmp_path / "policy.json"),
                     json.dumps(list(weaken)), SYSTEM_PYTHON, "-c", program, *targets],
            "timeout": 90} | world
    # (the runner imports the package these tests import: a mutant's copy's, scripts/mutants.py)
    package = os.path.dirname(os.path.dirname(stockade.__file__))
    done = subprocess.run([sys.executable, str(WORLD), json.dumps(spec)], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": package})
    assert done.returncode == 0 and done.stdout, done.stderr
    report = json.loads(done.stdout)
    lines = [json.loads(line) for line in report["stdout"].splitlines() if line.startswith("[")]
    report["attempts"] = {f"{kind}:{where}": outcome for kind, where, outcome in lines}
    report["result"] = next((json.loads(line) for line in report["stdout"].splitlines()
                             if line.startswith("{")), {})
    return report


# Runs in the world: the policy through the API, on a Linux backend with `weaken` switched
# off (tests only), the probe's lines passed through, then the Result's summary as JSON.
RUNNER = r"""
import json, os, sys
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy.parse import load_policy
policy_file, weaken, argv = sys.argv[1], frozenset(json.loads(sys.argv[2])), sys.argv[3:]
request = compile_policy(load_policy(policy_file), argv, CompileContext.current())
backend = LinuxBackend(weaken=weaken)
backend.check(request)
result = execute(backend, request)
sys.stdout.write(result.stdout.decode())
print(json.dumps({"exit": result.exit_code, "uid": os.geteuid(),
                  "violations": [[v.kind, v.detail] for v in result.violations],
                  "stderr": result.stderr.decode()[-2000:]}))
"""


def reached(report: dict) -> set[str]:
    """The addresses the world's servers saw a connection or datagram reach."""
    return {f"{server}:{address}:{protocol}" for server, address, protocol in report["seen"]}


def test_the_runner_is_as_the_suite_runs(tmp_path: Path) -> None:
    report = in_world(tmp_path, None, [])
    assert report["result"]["uid"] == os.geteuid(), report  # (rootless in the world too)
    assert report["result"]["exit"] == 0, report


def test_any_reaches_the_public_host_and_none_of_the_guarded(tmp_path: Path) -> None:
    report = in_world(tmp_path, None, OPEN + GUARDED)
    attempts = report["attempts"]
    assert attempts[f"tcp:{PUBLIC}:80"] == f"internet {PUBLIC}", report
    assert attempts[f"udp:{PUBLIC}:7"] == "ping", report
    assert attempts["dns:public.test"] == PUBLIC, report
    # the gateway is the world's router, not mapped to the host's loopback
    assert attempts[f"tcp:{ROUTER}:80"] == f"internet {ROUTER}", report
    for target in GUARDED:
        assert attempts[target].startswith("error"), (target, report)
    assert reached(report) == {f"internet:{PUBLIC}:tcp", f"internet:{PUBLIC}:udp",
                               f"internet:{ROUTER}:tcp", f"resolver:{RESOLVER}:dns"}, report
    denied = {detail for kind, detail in report["result"]["violations"]
              if kind == "network.denied"}
    for expected in (f"tcp {METADATA}:80: address_metadata", f"tcp {PRIVATE}:80: "
                     "address_private", f"udp {METADATA}:7: address_metadata",
                     f"tcp {HOST}:80: address_host_address"):
        assert expected in denied, report


def test_the_hosts_own_address_is_refused_and_said_within_a_reached_range(tmp_path: Path
                                                                          ) -> None:
    """Issue 32: pasta gives the sandbox the host's address, so a connection to it stayed
    inside, met a closed port and left no record; now the guard refuses it first, and says
    so, even within a range network.reach lifts the guard for (the router in it is reached)."""
    report = in_world(tmp_path, {"network": {"mode": "any", "reach": [f"{HOST}/24"]}},
                      [f"tcp:{HOST}:80", f"tcp:{ROUTER}:80"])
    assert report["attempts"][f"tcp:{HOST}:80"].startswith("error"), report
    assert report["attempts"][f"tcp:{ROUTER}:80"] == f"internet {ROUTER}", report
    assert f"host-address:{HOST}:tcp" not in reached(report), report
    assert [f"tcp {HOST}:80: address_host_address"] == \
        sorted({d for kind, d in report["result"]["violations"] if kind == "network.denied"}), \
        report


def test_reach_naming_the_hosts_own_address_alone_is_refused_at_launch(tmp_path: Path) -> None:
    """It could never be reached (the address is the sandbox's own): refused, typed, with the
    way that works; an address of another machine is accepted."""
    own = guard.own_addresses(usernet.host_addresses())
    if not own:
        unavailable("this host has no address but loopback and link-local")
    address = own[0]
    entry = f"{address}:5432" if address.version == 4 else f"[{address}]:5432"
    assert usernet.own_in_reach([entry], map(str, own)) == (entry, str(address))
    assert usernet.own_in_reach([f"{PUBLIC}:80"], [str(address)]) is None
    done = subprocess.run([sys.executable, "-m", "stockade", "run", "--network", "any",
                           "--reach", entry, "--", "true"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 70, done
    assert "unenforceable:network.reach" in done.stderr and "allowlist" in done.stderr, done


def test_refusals_the_log_drops_are_counted_and_said(tmp_path: Path) -> None:
    """A burst of 120 refused connections: the log's rate limit keeps a record of some; the
    result says how many more were refused without one (they were dropped silently before),
    and the records and that number add up to every refused packet. A few drop nothing."""
    burst = [f"tcp:{PRIVATE}:{port}" for port in range(1000, 1120)]
    report = in_world(tmp_path, None, burst)
    assert all(report["attempts"][t].startswith("error") for t in burst), report
    violations = report["result"]["violations"]
    records = [d for kind, d in violations if kind == "network.denied"]
    unrecorded = [d for kind, d in violations if kind == "network.denied_unrecorded"]
    assert len(unrecorded) == 1 and len(records) < len(burst), report
    # (every refused packet is counted: the sandbox's kernel may send one of its own)
    assert len(burst) <= len(records) + int(unrecorded[0].split()[0]) <= len(burst) + 4, report
    few = in_world(tmp_path, None, burst[:3])["result"]["violations"]
    assert "network.denied_unrecorded" not in {kind for kind, _ in few}, few
    assert {f"tcp {PRIVATE}:{port}: address_private" for port in (1000, 1001, 1002)} <= \
        {detail for _, detail in few}, few


def test_reach_lifts_the_guard_for_what_it_names_only(tmp_path: Path) -> None:
    report = in_world(tmp_path, {"network": {"mode": "any", "reach": [f"{PRIVATE}:80"]}},
                      [f"tcp:{PRIVATE}:80", f"udp:{PRIVATE}:7", f"tcp:{METADATA}:80"])
    attempts = report["attempts"]
    assert attempts[f"tcp:{PRIVATE}:80"] == f"internet {PRIVATE}", report
    assert attempts[f"udp:{PRIVATE}:7"].startswith("error"), report
    assert attempts[f"tcp:{METADATA}:80"].startswith("error"), report
    assert reached(report) == {f"internet:{PRIVATE}:tcp"}, report


@pytest.mark.parametrize(("weaken", "now_reached"), [
    (("address_guard",), {f"internet:{METADATA}:tcp", f"internet:{PRIVATE}:tcp",
                          f"internet:{dns.FORWARD}:tcp"}),
    (("usernet_isolation",), {"host-loopback:127.0.0.1:tcp"}),
])
def test_each_layer_is_what_keeps_its_destinations_out(tmp_path: Path, weaken: tuple[str, ...],
                                                       now_reached: set[str]) -> None:
    """The mutation proof, in the same world: with the guard off the metadata service, the
    private host and a link-local host on pasta's DNS forward address answer; with pasta's
    defaults (its port forwarding of the host's loopback and its gateway mapping), the host's
    loopback does, through the gateway's address."""
    targets = [f"tcp:{METADATA}:80", f"tcp:{PRIVATE}:80", f"tcp:{ROUTER}:80",
               f"tcp:{dns.FORWARD}:80"]
    report = in_world(tmp_path, None, targets, weaken)
    assert now_reached <= reached(report), report


def test_a_missing_tool_is_a_typed_refusal_naming_what_to_install(monkeypatch, tmp_path
                                                                   ) -> None:
    monkeypatch.setattr(usernet, "pasta_path", lambda: None)
    why = usernet.missing()
    assert why is not None and "pasta" in why and "apt install passt nftables" in why
    assert usernet.capability().enforced is False
    with pytest.raises(stockade.UnenforceableError) as info:
        stockade.run(["true"], policy=replace(policy_for("read-only"),
                                              network=NetworkPolicy(mode="any")),
                     workspace=tmp_path, cwd="/usr")
    assert info.value.code == "unenforceable:network.any" and "passt" in info.value.message
    causes = {cause.code: cause for cause in doctor.diagnose(probe=False).causes}
    assert causes["usernet_tools_missing"].blocks == "network.any"
    assert any("apt-get install passt nftables" in line
               for line in causes["usernet_tools_missing"].remedy)


STUB_CONF = "# systemd-resolved's stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\n" \
    "search corp.test\n"


@pytest.mark.parametrize("link", [True, False], ids=["symlink-into-run", "file"])
def test_a_resolver_on_the_hosts_loopback_answers_through_pastas_forward(tmp_path: Path,
                                                                          link: bool) -> None:
    """systemd-resolved's way (Ubuntu's, Fedora's): /etc/resolv.conf a symbolic link into
    /run naming the stub on the host's loopback. The sandbox has its own file naming pasta's
    forward, which relays its UDP queries to the stub; nothing else of the host's loopback,
    and nothing else on the forward's address (TCP included: this pasta does not relay it,
    it would leave for that address), is reached."""
    targets = ["dns:public.test", "read:/etc/resolv.conf", f"tcp:{dns.FORWARD}:53",
               f"tcp:{dns.FORWARD}:80", "tcp:127.0.0.53:53", "tcp:127.0.0.1:80"]
    report = in_world(tmp_path, None, targets, resolv=STUB_CONF, resolv_link=link)
    attempts = report["attempts"]
    assert attempts["dns:public.test"] == PUBLIC, report
    own = attempts["read:/etc/resolv.conf"].splitlines()
    assert [line for line in own if not line.startswith("#")] == [
        f"nameserver {dns.FORWARD}", "options edns0 trust-ad", "search corp.test"]
    for target in targets[2:]:
        assert attempts[target].startswith("error"), (target, report)
    assert reached(report) == {"host-resolver:127.0.0.53:dns"}, report
    denied = {detail for kind, detail in report["result"]["violations"]
              if kind == "network.denied"}
    assert f"tcp {dns.FORWARD}:53: address_link_local" in denied, report


def test_a_denied_resolv_conf_stays_denied(tmp_path: Path) -> None:
    """The sandbox's own file does not cover a mask the policy asked for."""
    report = in_world(tmp_path, {"filesystem": {"deny": ["/etc/resolv.conf"]}},
                      ["read:/etc/resolv.conf"])
    assert report["attempts"]["read:/etc/resolv.conf"] == "error 13", report


@pytest.mark.parametrize(("conf", "servers", "lost"), [
    (STUB_CONF, [dns.FORWARD], []),
    ("nameserver 127.0.0.53\nnameserver 10.0.0.2\n", [dns.FORWARD, "10.0.0.2"], []),
    ("nameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver 127.0.0.1\n",
     [dns.FORWARD, "fe80::1"], []),
    ("nameserver ::1\n", [], ["::1"]),
    ("# none\n", [], []),
])
def test_the_sandboxs_resolvers_follow_the_hosts(conf: str, servers: list[str],
                                                 lost: list[str]) -> None:
    """Pure logic (dns.py): the forward stands for the host's first IPv4 resolver (pasta
    relays to it); an IPv6-only loopback resolver is lost, and refused."""
    assert dns.sandbox_servers(conf) == servers
    assert dns.lost(conf) == lost


def test_an_ipv6_only_loopback_resolver_is_refused_with_its_remedy(monkeypatch) -> None:
    monkeypatch.setattr(usernet.dns, "read_host", lambda: "nameserver ::1\n")
    causes = {cause.code: cause for cause in doctor.diagnose(probe=False).causes}
    assert causes["resolver_on_loopback"].blocks == "network.any"
    assert "::1" in (usernet.missing() or "")


def test_the_cli_runs_it_and_logs_each_refusal(tmp_path: Path) -> None:
    """`stockade run` as a user runs it: the guard's refusals in --network-log (one JSON line
    each, as the proxy's) and summarised on stderr; the exit status passes through."""
    (tmp_path / "policy.json").write_text(json.dumps(
        {"version": 1, "preset": "read-only", "network": {"mode": "any"}}))
    log = tmp_path / "network.log"
    tmp_path.chmod(0o777)
    spec = {"argv": [sys.executable, "-m", "stockade", "run", "--policy",
                     str(tmp_path / "policy.json"), "--network-log", str(log), "--",
                     SYSTEM_PYTHON, "-c", PROBE + "\nraise SystemExit(3)\n",
                     f"tcp:{METADATA}:80", f"tcp:{PUBLIC}:80"], "timeout": 60}
    done = subprocess.run([sys.executable, str(WORLD), json.dumps(spec)], capture_output=True,
                          text=True, timeout=120, check=False)
    report = json.loads(done.stdout)
    assert report["returncode"] == 3, report
    assert f"stockade: the sandbox's network destination guard refused tcp {METADATA}:80: " \
        "address_metadata: a guarded address, which only network.reach lets past the " \
        f"destination guard; the policy grant that would allow it: network.reach {METADATA}:80" \
        in report["stderr"], report
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (entry["protocol"], entry["host"], entry["port"], entry["decision"],
            entry["reason"]) == ("tcp", METADATA, 80, "deny", "address_metadata"), entry
    assert reached(report) == {f"internet:{PUBLIC}:tcp"}, report


def test_a_run_returns_with_its_pasta_ended_and_nothing_of_it_held(tmp_path: Path) -> None:
    """Once `run` returns, the owner holds nothing more than before it: no descriptor of the
    pasta that served the sandbox, no thread but the long-lived ones (a count taken between two
    runs is then exact, whatever ran before: tests/test_ledger.py's soak relies on it)."""
    policy = replace(policy_for(), network=NetworkPolicy(mode="any"))
    assert stockade.run(["true"], policy, workspace=tmp_path).exit_code == 0
    time.sleep(1)  # (whatever the first run left to end by itself has ended: the baseline)
    before = len(os.listdir("/proc/self/fd")), sorted(map(str, threading.enumerate()))
    assert stockade.run(["true"], policy, workspace=tmp_path).exit_code == 0
    assert (len(os.listdir("/proc/self/fd")), sorted(map(str, threading.enumerate()))) == before
