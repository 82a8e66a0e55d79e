"""network.mode = "any" lets in only replies: real sandboxed children in the test's own small
internet (tests/networld.py), as root and rootless.

The child binds a UDP port (and a TCP listener) of its choosing, sends one datagram from it to
the public host's echo and resolves a name through pasta's DNS relay (the positive controls:
replies from peers it contacted arrive), then listens. Meanwhile, from outside the sandbox, the
host knocks at that port from its loopback and its own address, and another machine of the
world does from its address and from the contacted host's other port: UDP and TCP. What the
child received, and which host sockets were bound on that port, are read on each side.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from networld import HOST6, OTHER6, PUBLIC6
from test_network_any import HOST, PUBLIC, RUNNER, STUB_CONF, SYSTEM_PYTHON, WORLD

from stockade.linux import usernet

pytestmark = pytest.mark.usefixtures("linux")

OTHER = "203.0.113.66"
# (the host's loopback, the host's own address, the contacted public host, another machine)
FAMILIES = {4: ("127.0.0.1", HOST, PUBLIC, OTHER), 6: ("::1", HOST6, PUBLIC6, OTHER6)}
KNOCK = 99
REFLECT = 3478
PORT = 21234  # the child's port: outside the ephemeral range (a service's, say)
LISTEN = 8.0  # seconds the child listens after its controls
KNOCKING = 4.5  # seconds the host and the other machine knock, in rounds, within LISTEN

# The child: its controls, then every datagram and connection that reaches its port.
CHILD = r"""
import json, select, socket, sys, time
port, public, listen, reflect = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), \
    int(sys.argv[4])
family, anywhere = (socket.AF_INET6, "::") if ":" in public else (socket.AF_INET, "0.0.0.0")
def say(*line):
    print(json.dumps(line), flush=True)
udp = socket.socket(family, socket.SOCK_DGRAM)
udp.bind((anywhere, port))
tcp = socket.socket(family)
tcp.bind((anywhere, port))
tcp.listen(8)
tcp.setblocking(False)
# (pasta loses the reply to a sandbox's very first IPv6 datagram, every guard layer off too:
# the control asks up to three times)
udp.settimeout(2)
for _ in range(3):
    udp.sendto(b"ping", (public, 7))
    try:
        data, peer = udp.recvfrom(200)
        say("reply", f"{peer[0]}:{peer[1]}", data.decode())
        break
    except OSError as exc:
        error = exc
else:
    say("reply", "", f"error {error.errno}")
udp.settimeout(5)
# the host port its datagrams leave from, as a STUN server tells it; bound here too, so that
# whatever pasta relays to that port finds a socket
listeners = [udp]
udp.sendto(b"port?", (public, reflect))
try:
    mapped = int(udp.recvfrom(200)[0].decode().rpartition(":")[2])
    say("mapped", "", str(mapped))
    if mapped != port:
        listeners.append(socket.socket(family, socket.SOCK_DGRAM))
        listeners[-1].bind((anywhere, mapped))
except OSError as exc:
    say("mapped", "", f"error {exc.errno}")
try:
    say("dns", "public.test", socket.gethostbyname("public.test"))
except OSError as exc:
    say("dns", "public.test", f"error {exc.errno}")
client = socket.socket(family)
client.bind((anywhere, port + 1))
client.settimeout(5)
try:
    client.connect((public, 80))
    say("tcp", f"{public}:80", client.recv(100).decode().strip())
except OSError as exc:
    say("tcp", f"{public}:80", f"error {exc.errno}")
end = time.monotonic() + listen
while time.monotonic() < end:
    for ready in select.select(listeners, [], [], 0.2)[0]:
        data, peer = ready.recvfrom(200)
        say("received", f"{peer[0]}:{peer[1]}", data.decode(errors="replace"))
    try:
        conn, peer = tcp.accept()
        say("accepted", f"{peer[0]}:{peer[1]}", "")
        conn.close()
    except BlockingIOError:
        pass
"""

# Runs in the world's host namespace, outside the sandbox: starts it, waits until the public
# echo saw its datagram, reads the host's sockets on the port, knocks, and reports.
DRIVER = r"""
import json, os, socket, subprocess, sys, time
port, loopback, host, other, knock, knocking = int(sys.argv[1]), sys.argv[2], sys.argv[3], \
    sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
runner = sys.argv[7:]
family = socket.AF_INET6 if ":" in host else socket.AF_INET
def sockets():
    found = set()
    for table in ("udp", "udp6", "tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in list(f)[1:]:
                local = line.split()[1]
                found.add((table, local.rpartition(":")[0], int(local.rpartition(":")[2], 16)))
    return found
def echoed(count):
    try:
        with open(os.environ["NETWORLD_SEEN"]) as f:
            return f.read().count('"internet"') >= count
    except FileNotFoundError:
        return False
already = sockets()
sandbox = subprocess.Popen(runner, stdout=subprocess.PIPE, text=True)
deadline = time.monotonic() + 40
while not echoed(2) and time.monotonic() < deadline and sandbox.poll() is None:
    time.sleep(0.05)
time.sleep(0.3)
opened = sorted(sockets() - already)
targets = sorted({port} | {number for table, _, number in opened if table.startswith("udp")})
knocks = {}
def keep(key, outcome):  # an outcome that got in outlives the rounds that did not
    if key not in knocks or str(knocks[key]).startswith("error"):
        knocks[key] = outcome
# (in rounds over KNOCKING seconds: pasta forwards a port the child bound only after its next
# scan of the child's sockets, and may lose a first IPv6 datagram: a single knock at once missed
# every port with every guard layer off)
start = time.monotonic()
while time.monotonic() < start + knocking:
    for target in targets:
        for source in (loopback, host):
            with socket.socket(family, socket.SOCK_DGRAM) as u:
                u.bind((source, 0))
                u.sendto(f"unsolicited from {source}".encode(), (source, target))
            try:
                with socket.create_connection((source, target), timeout=2):
                    keep(f"tcp {source}:{target}", "connected")
            except OSError as exc:
                keep(f"tcp {source}:{target}", f"error {exc.errno}")
        with socket.create_connection((other, knock), timeout=5) as c:
            c.sendall(f"{host} {target}\n".encode())
            answer = json.loads(c.makefile().readline())
        if f"other:{target}" not in knocks or answer["tcp"] == "connected":
            knocks[f"other:{target}"] = answer
    time.sleep(0.3)
out, _ = sandbox.communicate(timeout=60)
sys.stdout.write(out)
print(json.dumps({"driver": {"opened": opened, "knocks": knocks}}))
"""


def knocked(tmp_path: Path, weaken: tuple[str, ...] = (), version: int = 4) -> dict:
    """Run the child in a network-any sandbox of the world (its resolver on the host's loopback,
    so DNS goes through pasta's relay), with `weaken` switched off, knocking at its port: in
    IPv4 or IPv6 (`version`: the child's sockets, its contact and every knock)."""
    loopback, host, public, other = FAMILIES[version]
    policy = {"version": 1, "preset": "read-only", "network": {"mode": "any"}}
    for name, text in (("runner.py", RUNNER), ("driver.py", DRIVER),
                       ("policy.json", json.dumps(policy))):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o644)
    tmp_path.chmod(0o755)
    runner = [sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "policy.json"),
              json.dumps(list(weaken)), SYSTEM_PYTHON, "-c", CHILD, str(PORT), public,
              str(LISTEN), str(REFLECT)]
    spec = {"argv": [sys.executable, str(tmp_path / "driver.py"), str(PORT), loopback, host,
                     other, str(KNOCK), str(KNOCKING), *runner],
            "timeout": 100, "resolv": STUB_CONF}
    done = subprocess.run([sys.executable, str(WORLD), json.dumps(spec)], capture_output=True,
                          text=True, timeout=130, check=False)
    assert done.returncode == 0 and done.stdout, done.stderr
    report = json.loads(done.stdout)
    lines = [json.loads(line) for line in report["stdout"].splitlines()]
    report["child"] = [line for line in lines if isinstance(line, list)]
    report["driver"] = next(line["driver"] for line in lines
                            if isinstance(line, dict) and "driver" in line)
    report["result"] = next(line for line in lines if isinstance(line, dict) and "exit" in line)
    return report


@pytest.mark.parametrize("version", [4, 6], ids=["ipv4", "ipv6"])
def test_only_replies_reach_the_sandbox_and_no_host_port_opens_for_it(tmp_path: Path,
                                                                       version: int) -> None:
    """Failed before the guard's input chain and its source-port remapping: every knock
    reached the child, and pasta held 0.0.0.0:PORT on the host. In IPv6 the same: the child's
    sockets, its contact and the knocks (from ::1, the host's IPv6 address, another machine's)
    are IPv6."""
    public = FAMILIES[version][2]
    report = knocked(tmp_path, version=version)
    child = {(what, peer): text for what, peer, text in report["child"]}
    assert child[("reply", f"{public}:7")] == "ping", report
    assert child[("dns", "public.test")] == PUBLIC, report
    assert child[("tcp", f"{public}:80")] == f"internet {public}", report
    assert not unsolicited(report), report
    opened = report["driver"]["opened"]
    assert not [entry for entry in opened if entry[2] in (PORT, PORT + 1)], report
    # what pasta holds for the child's flows: ports as the host's kernel gives any client,
    # each knocked at above (from the loopback, the host's address, another machine)
    low, high = usernet.ephemeral_ports()
    held = {number for table, _, number in opened if table.startswith("udp")}
    assert held and all(low <= number <= high for _, _, number in opened), report
    assert {f"other:{number}" for number in held} <= set(report["driver"]["knocks"]), report
    assert not [outcome for where, outcome in report["driver"]["knocks"].items()
                if where.startswith("tcp") and not outcome.startswith("error")], report
    assert not [knock for where, knock in report["driver"]["knocks"].items()
                if where.startswith("other") and not knock["tcp"].startswith("error")], report


@pytest.mark.parametrize(("weaken", "now", "version"), [
    ("inbound_guard", "every knock is received", 4),
    ("source_ports", "pasta binds the child's own port on the host", 4),
    ("inbound_guard", "every knock is received", 6),
    ("source_ports", "pasta binds the child's own port on the host", 6),
])
def test_each_layer_is_what_keeps_its_part_shut(tmp_path: Path, weaken: str, now: str,
                                                version: int) -> None:
    """The mutation proof in the same world: without the input chain every knock at the port
    pasta holds comes in (the child learnt it from the reflector and bound it); without the
    remapping the host port is the child's choice."""
    loopback, host, public, other = FAMILIES[version]
    report = knocked(tmp_path, (weaken,), version)
    if weaken == "inbound_guard":
        senders = {text for text in unsolicited(report)}
        assert senders >= {f"unsolicited from {loopback}", f"unsolicited from {host}",
                           f"unsolicited from {other}:0", f"unsolicited from {public}:9"}, \
            (now, report)
    else:
        assert [entry for entry in report["driver"]["opened"]
                if entry[0].startswith("udp") and entry[2] == PORT], (now, report)


def unsolicited(report: dict) -> list[str]:
    """What reached the child that it did not ask for."""
    return [text for what, _, text in report["child"] if what in ("received", "accepted")]
