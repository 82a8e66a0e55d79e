"""VM containment with QEMU (stockade/vm): the machine a policy gets, and a real guest booted
under TCG (slow: one guest per module) running commands over the session protocol.

Where qemu-system-x86_64, a kernel with 9p and virtio-pci, or a static busybox is missing, the
guest tests fail with the reason (conftest.unavailable): on Linux they must run."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from conftest import unavailable

import stockade
from stockade.errors import StartError, UnavailableError, UnenforceableError, UsageError
from stockade.launch.compile import CompileContext
from stockade.launch.request import LaunchRequest, NetworkSpec, PathGrant
from stockade.lifecycle import statedir
from stockade.lifecycle.homes import ensure as ensure_home
from stockade.lifecycle.homes import home_for
from stockade.policy import merge
from stockade.session import boot
from stockade.session.client import DaemonClient
from stockade.session.daemon import Daemon
from stockade.session.errors import SessionError
from stockade.session.exchange import Output
from stockade.vm import cpio, egress, initramfs, machine, qemu


@pytest.fixture
def root(tmp_path) -> str:
    """A write root whose name has a comma (QEMU's option separator)."""
    (tmp_path / "w,x").mkdir()
    return str(tmp_path / "w,x")


def _request(root: str, **changes) -> LaunchRequest:
    fields = {"argv": ("true",), "cwd": "/", "env": (),
              "read": (PathGrant("/usr", "/usr"), PathGrant("/usr/lib", "/lib"),
                       PathGrant("/etc", "/etc")),
              "write": (PathGrant(root, root),)}
    return LaunchRequest(**(fields | changes))


# --- the machine, without QEMU -------------------------------------------------------------------

def test_each_root_is_its_own_share_and_nested_reads_fold_into_their_parent(root):
    guest = machine.plan(_request(root))
    assert {(s.path, s.writable) for s in guest.shares} == {
        ("/usr", False), ("/etc", False), (root, True)}
    assert len({s.tag for s in guest.shares}) == 3


def test_network_any_is_refused(root):
    with pytest.raises(UnenforceableError) as info:
        machine.plan(_request(root, network=NetworkSpec(mode="any")))
    assert info.value.code == "unenforceable:network"


def test_only_an_allowlist_guest_has_a_network_device_and_it_is_restricted(root):
    kernel = initramfs.Kernel("r", "/boot/vmlinuz-r", ())
    closed = machine.qemu_argv(kernel, "/d/i", "/d/a", "/d/l", machine.plan(_request(root)))
    assert closed[closed.index("-nic") + 1] == "none" and "-netdev" not in closed
    guest = machine.plan(_request(root, network=NetworkSpec(mode="allowlist",
                                                            allow=("x.test",))))
    argv = machine.qemu_argv(kernel, "/d/i", "/d/a", "/d/l", guest, "/d/p,q/proxy.sock")
    netdev = argv[argv.index("-netdev") + 1]
    assert netdev.startswith("user,id=egress,restrict=on,ipv6=off,")
    assert netdev.count("guestfwd=") == 1 and "hostfwd" not in netdev
    assert "guestfwd=tcp:10.0.2.100:3128-cmd:" in netdev and "/d/p,,q/proxy.sock" in netdev
    script = machine.init_script(guest, ["/bin/true"])
    assert "ip addr add 10.0.2.15/24 dev eth0" in script and "route" not in script


def test_the_egress_relay_passes_each_end_on_and_nothing_of_its_own(tmp_path):
    """The relay as QEMU runs it (its argv from the netdev option; the guest connection one
    socket on its stdin, stdout and stderr): the bytes and each side's half-close cross it
    both ways; with no proxy to reach, the guest sees only the end, never a traceback."""
    command = shlex.split(egress.netdev(str(tmp_path / "proxy.sock")).split("-cmd:", 1)[1]
                          .replace(",,", ","))
    proxy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proxy.bind(str(tmp_path / "proxy.sock"))
    proxy.listen(1)
    guest, theirs = socket.socketpair()
    relay = subprocess.Popen(command, stdin=theirs, stdout=theirs, stderr=theirs)
    theirs.close()
    guest.settimeout(10)
    proxy.settimeout(10)
    try:
        upstream, _ = proxy.accept()
        upstream.settimeout(10)
        upstream.sendall(b"answer")
        upstream.shutdown(socket.SHUT_WR)
        assert _read_to_end(guest) == b"answer"  # the proxy's end reached the guest,
        guest.sendall(b"request")  # which can still send
        guest.shutdown(socket.SHUT_WR)
        assert _read_to_end(upstream) == b"request"  # and its end reached the proxy
        assert relay.wait(10) == 0
        upstream.close()
        os.unlink(tmp_path / "proxy.sock")
        guest, theirs = socket.socketpair()
        relay = subprocess.Popen(command, stdin=theirs, stdout=theirs, stderr=theirs)
        theirs.close()
        guest.settimeout(10)
        assert relay.wait(10) != 0 and _read_to_end(guest) == b""
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        guest.close()
        proxy.close()


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_qemu_argv_has_no_network_device_and_read_only_shares(root):
    guest = machine.plan(_request(root))
    kernel = initramfs.Kernel("r", "/boot/vmlinuz-r", ())
    argv = machine.qemu_argv(kernel, "/d/initrd", "/d/agent.sock", "/d/log", guest)
    text = " ".join(argv)
    assert "-netdev" not in argv and argv[argv.index("-nic") + 1] == "none"
    assert "-accel tcg" in text and "-M q35" in text
    assert "path=/usr,security_model=none,readonly=on" in text
    writable = "mapped-xattr" if os.geteuid() == 0 else "none"  # root: no setuid on the host
    assert f"path={root[:-2]},,x,security_model={writable} " in text + " "  # commas doubled
    assert "path=/d/agent.sock,server=off" in text


def test_init_script_mounts_every_share_and_execs_the_agent_on_the_port(root):
    guest = machine.plan(_request(root))
    script = machine.init_script(guest, ["/usr/bin/python3", "-c", "print('x')"])
    for share in guest.shares:
        # exec_from_write is false; no setuid bit or device counts anywhere
        mode = "rw,nosuid,nodev,noexec" if share.writable else "ro,nosuid,nodev"
        assert f",{mode} {share.tag} '/newroot{share.path}'" in script or \
            f",{mode} {share.tag} /newroot{share.path}" in script
    assert script.rstrip().endswith("'print('\"'\"'x'\"'\"')' 0<>\"/newroot$port\" 1>&0")


def test_the_guest_protects_what_the_linux_backend_does_and_refuses_alike(root, tmp_path):
    """The same walk (protect.guards): nested names, a `.git` file's gitdir and linked files
    read-only (with `.git` read-only whole, then guarded), the directories above them kept; a
    protected name that is a symlink refused."""
    for directory in ("a/.git", "wt", "gitdirs/wt"):
        os.makedirs(f"{root}/{directory}")
    with open(f"{root}/wt/.git", "w") as f:
        f.write("gitdir: ../gitdirs/wt\n")
    (tmp_path / "outside").write_text("")
    os.link(tmp_path / "outside", f"{root}/linked")
    protected = (".agents", ".git")
    secret = f"{root}/a/.git/secret"
    guest = machine.plan(_request(root, protected=protected,
                                  deny=(PathGrant(secret, secret),)))
    assert set(guest.frozen) == {f"{root}/a/.git", f"{root}/wt/.git", f"{root}/gitdirs/wt",
                                 f"{root}/linked"}
    assert set(guest.kept) == {f"{root}/a", f"{root}/wt", f"{root}/gitdirs"}
    script = machine.init_script(guest, ["/bin/true"])
    kept, frozen, hidden = (script.index(f"--rbind {shlex.quote(f'/newroot{root}/a')} "),
                            script.index(f"--bind {shlex.quote(f'/newroot{root}/a/.git')} "),
                            script.index(f"if [ -d {shlex.quote(f'/newroot{secret}')} ]"))
    assert kept < frozen < hidden  # a later bind would cover an earlier mount below it
    # `.git` guarded (the default): its config and hooks (made, as git would), the `.git`
    # file, and the config and hooks of the gitdir it names; the directories above kept.
    guest = machine.plan(_request(root, protected=(".agents",)))
    assert set(guest.frozen) == {f"{root}/{path}" for path in (
        "a/.git/config", "a/.git/hooks", "wt/.git", "gitdirs/wt/config", "gitdirs/wt/hooks",
        "linked")}
    assert set(guest.kept) == {f"{root}/{path}"
                               for path in ("a", "a/.git", "wt", "gitdirs", "gitdirs/wt")}
    os.symlink("a", f"{root}/.agents")
    with pytest.raises(UnenforceableError) as info:
        machine.plan(_request(root, protected=protected))
    assert info.value.code == "unenforceable:filesystem.protected"


def test_the_guest_pins_the_directories_above_a_hidden_path(root):
    """A 9p mask moves with a renamed parent as a Linux one would: the directories between the
    write root and a denied path that exists are kept (mount points), before it is hidden."""
    os.makedirs(f"{root}/conf/gh")
    secret = f"{root}/conf/gh/hosts.yml"
    with open(secret, "w") as f:
        f.write("x")
    guest = machine.plan(_request(root, deny=(PathGrant(secret, secret),)))
    assert set(guest.kept) == {f"{root}/conf", f"{root}/conf/gh"}
    script = machine.init_script(guest, ["/bin/true"])
    assert (script.index(f"--rbind {shlex.quote(f'/newroot{root}/conf/gh')} ")
            < script.index(f"if [ -d {shlex.quote(f'/newroot{secret}')} ]"))


def test_a_hidden_directory_holding_a_share_shows_that_share_alone(root):
    """Issue 29 H1: the private homes' directory is hidden in every guest and the run's own
    home, a share inside it, granted back: an empty tmpfs covers the directory before that
    share is mounted on it, and is then made read-only; no other mask hides the share."""
    homes = f"{root}/state-homes"
    home = f"{homes}/ws-0123"
    os.makedirs(f"{homes}/other-4567")
    os.makedirs(home)
    guest = machine.plan(_request(root, write=(PathGrant(root, root), PathGrant(home, home)),
                                  deny=(PathGrant(homes, homes),)))
    script = machine.init_script(guest, ["/bin/true"])
    target, share = shlex.quote(f"/newroot{homes}"), shlex.quote(f"/newroot{home}")
    cover = script.index(f"busybox mount -t tmpfs -o mode=0755,size=16k,nosuid,nodev,noexec "
                         f"homes {target}\n")
    tags = {s.path: s.tag for s in guest.shares}
    assert (script.index(f"noexec {tags[root]} {shlex.quote('/newroot' + root)}\n")
            < cover < script.index(f"noexec {tags[home]} {share}\n")
            < script.index(f"busybox mount -o remount,bind,ro,nosuid,nodev,noexec {target}\n"))
    assert f"deny {target}" not in script and f"deny {share}" not in script


def test_cpio_newc_entries_are_aligned_and_terminated():
    archive = cpio.Archive()
    archive.directory("d")
    archive.file("d/f", b"abc", 0o755)
    archive.symlink("l", "d/f")
    data = archive.finish()
    assert data.startswith(b"070701") and len(data) % 4 == 0
    assert data.count(b"070701") == 4 and b"TRAILER!!!\0" in data
    names = []
    offset = 0
    while offset < len(data):
        header = data[offset:offset + 110]
        size, namesize = int(header[54:62], 16), int(header[94:102], 16)
        name_end = offset + 110 + namesize
        names.append(data[offset + 110:name_end - 1].decode())
        offset = name_end + (-name_end % 4) + size
        offset += -offset % 4
    assert names == ["d", "d/f", "l", "TRAILER!!!"]


def test_a_kernel_without_9p_is_unavailable(tmp_path):
    (tmp_path / "vmlinuz-1").write_bytes(b"")
    (tmp_path / "config-1").write_text("CONFIG_VIRTIO_PCI=y\n# CONFIG_NET_9P is not set\n")
    with pytest.raises(UnavailableError) as info:
        initramfs.find_kernel(str(tmp_path), str(tmp_path))
    assert info.value.code == "vm_kernel_unavailable" and "CONFIG_9P_FS" in info.value.message


def test_modules_load_after_their_dependencies(tmp_path):
    tree = tmp_path / "1"
    tree.mkdir()
    (tree / "modules.dep").write_text("kernel/fs/9p/9p.ko: kernel/fs/netfs.ko kernel/9pnet.ko\n"
                                      "kernel/fs/netfs.ko:\nkernel/9pnet.ko: kernel/fs/netfs.ko\n")
    order = initramfs.load_order(str(tree), ["9p"])
    assert [os.path.basename(p) for p in order] == ["netfs.ko", "9pnet.ko", "9p.ko"]


# --- a real guest ----------------------------------------------------------------------------

def _vm_available() -> str | None:
    """Why a guest cannot boot here, or None."""
    try:
        qemu.host_kernel()
    except UnavailableError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def vm_ready() -> None:
    reason = _vm_available()
    if reason is not None:
        unavailable(f"VM containment unavailable here: {reason}")


def _qemus() -> set[int]:
    """Pids of the QEMU processes this test process started through the driver (their private
    directory is named stockade-vm-*)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read()
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
            if (line.startswith(machine.QEMU.encode()) and b"stockade-vm-" in line
                    and parent == os.getpid()):
                found.add(int(entry))
    return found


@pytest.fixture(scope="module")
def guest(vm_ready, tmp_path_factory):
    workspace = tmp_path_factory.mktemp("vm-ws")
    began = time.monotonic()
    sb = qemu.VmSandbox(preset="workspace-write-no-exec", workspace=workspace)
    sb.boot_seconds = time.monotonic() - began  # type: ignore[attr-defined]
    yield sb, workspace
    sb.close()


def test_argv_cwd_env_and_exit_codes(guest):
    sb, workspace = guest
    (workspace / "sub").mkdir(exist_ok=True)
    r = sb.run(["sh", "-c", 'printf "%s|" "$0" "$1" "$PWD" "$FOO"; exit 3', "a b", "c"],
               cwd=workspace / "sub", env={"FOO": "bar"})
    assert r.exit_code == 3 and r.backend == "qemu-vm"
    assert r.stdout.decode() == f"a b|c|{workspace}/sub|bar|"
    assert sb.run(["true"]).exit_code == 0
    with pytest.raises(StartError) as info:
        sb.run(["no-such-command-here"])
    assert info.value.code == "command_not_found"
    assert sb.enforced["observed_in_sandbox"]["CapEff"] == 0


def test_output_is_streamed_before_the_command_ends(guest):
    sb, _ = guest
    seen = []
    for event in sb.stream(["sh", "-c", "echo first; sleep 3; echo second"]):
        seen.append((time.monotonic(), event))
    first = next(t for t, e in seen if isinstance(e, Output) and b"first" in e.data)
    assert seen[-1][0] - first > 2


def test_read_roots_are_read_only_and_the_workspace_is_writable(guest):
    sb, workspace = guest
    r = sb.run(["sh", "-c", "touch /usr/stockade-vm-probe; echo > /etc/stockade-vm-probe"])
    assert r.exit_code != 0 and r.stderr.count(b"Read-only file system") == 2
    assert sb.run(["sh", "-c", "echo hello > made-in-vm"]).exit_code == 0
    assert (workspace / "made-in-vm").read_text() == "hello\n"
    # A host directory beside the workspace, no root of the policy, is not in the guest. (Not
    # /home: the package the guest's agent loads is shared, and a checkout may lie under it.)
    beside = workspace.parent / f"{workspace.name}-beside"
    beside.mkdir(exist_ok=True)
    (beside / "host-only").write_text("host\n")
    r = sb.run(["ls", str(beside)])
    assert r.exit_code != 0 and b"No such file or directory" in r.stderr, r.stderr


def test_a_setuid_file_made_in_the_guest_is_not_setuid_on_the_host(guest):
    sb, workspace = guest
    r = sb.run(["sh", "-c", "cp /bin/true suid-try && chmod 4755 suid-try"])
    assert r.exit_code == 0, r.stderr
    mode = (workspace / "suid-try").stat().st_mode
    if os.geteuid() == 0:
        assert not mode & 0o6000, oct(mode)  # mapped-xattr: the bits live in an xattr
    else:
        assert (workspace / "suid-try").stat().st_uid == os.getuid()  # setuid to oneself


def test_nothing_written_can_be_executed_without_exec_from_write(guest):
    sb, workspace = guest
    for place in (str(workspace), "/tmp"):
        r = sb.run(["sh", "-c", f"cp /bin/true {place}/copied && {place}/copied"])
        assert r.exit_code == 126 and b"Permission denied" in r.stderr, (place, r)
    assert sb.run(["/bin/true"]).exit_code == 0  # read roots stay executable


# A program copied into a memfd, run by fexecve and by its /proc/self/fd path: what it printed.
MEMFD_EXEC = """
import os, subprocess
try:
    fd = os.memfd_create("payload", 0)
except OSError as exc:
    raise SystemExit(f"memfd_create {exc.errno}")
os.write(fd, open("/bin/true", "rb").read())
pid = os.fork()
if pid == 0:
    try:
        os.execve(fd, ["payload"], {})
    except OSError:
        os._exit(99)
print("fexecve", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print("path", subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=[fd]).returncode)
"""


def test_written_memory_is_not_executed_without_exec_from_write(guest):
    """The guest kernel (6.1 here) has no vm.memfd_noexec and the guest no exec watch: without
    exec_from_write no memfd can be made at all (EPERM); this ran both routes before."""
    sb, _ = guest
    r = sb.run(["python3", "-c", MEMFD_EXEC])
    assert r.stderr.strip() == f"memfd_create {errno.EPERM}".encode(), r
    assert b"fexecve" not in r.stdout


def test_with_exec_from_write_a_memfd_runs(vm_ready, tmp_path):
    """The control: where the policy lets written files run, written memory runs too."""
    with qemu.VmSandbox(_vm_policy("offline-build"), workspace=tmp_path) as sb:
        r = sb.run(["python3", "-c", MEMFD_EXEC])
    assert r.stdout == b"fexecve 0\npath 0\n", r


def test_the_guest_has_no_network_interface_but_lo(guest):
    sb, _ = guest
    assert sb.run(["ls", "/sys/class/net"]).stdout.split() == [b"lo"]


def test_timings(guest):
    sb, _ = guest
    latencies = []
    for _ in range(10):
        began = time.monotonic()
        sb.run(["true"])
        latencies.append(time.monotonic() - began)
    latencies.sort()
    print(f"vm boot {sb.boot_seconds:.2f}s, `true` median {latencies[5] * 1000:.0f}ms")
    assert sb.ping() < 5


def test_keep_detached_reaches_the_guests_agent(vm_ready, tmp_path):
    """The guest runs the same agent, told in the same hello: what a command detached (its
    stdout still the command's) runs on after the command, whose result does not wait for
    it, and answers a file the next command writes; closing ends the guest with it."""
    detach = ("setsid sh -c ': > started; while [ ! -f release ]; do sleep 0.1; done; "
              "echo > finished' & while [ ! -f started ]; do sleep 0.05; done; echo up")
    with qemu.VmSandbox(preset="workspace-write-no-exec", workspace=tmp_path,
                        keep_detached=True) as sb:
        assert sb.run(["sh", "-c", detach], cwd=tmp_path, timeout=30).stdout == b"up\n"
        assert sb.run(["touch", "release"], cwd=tmp_path).exit_code == 0
        deadline = time.monotonic() + 10
        while not (tmp_path / "finished").exists():
            assert time.monotonic() < deadline, "the detached process did not run on"
            time.sleep(0.1)


def test_close_leaves_no_qemu_and_no_directory(vm_ready, tmp_path):
    before = _qemus()
    sb = qemu.VmSandbox(preset="read-only", workspace=tmp_path)
    handle = sb._session.handle
    assert isinstance(handle, qemu.VmHandle) and _qemus() - before == {sb.pid}
    assert sb.run(["true"]).exit_code == 0
    sb.close()
    assert sb.pid not in _qemus() and not os.path.exists(handle.workdir)
    with pytest.raises(SessionError):
        sb.run(["true"])


def test_a_guest_that_never_answers_is_retried_then_torn_down(vm_ready, tmp_path):
    before = _qemus()
    with pytest.raises(SessionError) as info:
        qemu.VmSandbox(preset="read-only", workspace=tmp_path, timeout=0.2)
    assert info.value.code == "session_boot_failed" and "3 attempts" in info.value.message
    assert not _qemus() - before


def test_the_vm_sandbox_is_part_of_the_public_api():
    import stockade

    assert stockade.VmSandbox is qemu.VmSandbox and "VmSandbox" in stockade.__all__
    assert issubclass(stockade.VmSandbox, stockade.Sandbox)


# --- `containment = "vm"` in a policy -----------------------------------------------------------

def _vm_policy(name: str = "read-only") -> stockade.Policy:
    return dataclasses.replace(stockade.preset(name), containment="vm")


def test_the_namespace_boot_never_takes_a_vm_policy(tmp_path):
    with pytest.raises(UsageError):
        boot.boot(_vm_policy(), CompileContext.current(tmp_path))


def test_a_vm_policy_runs_in_a_fresh_guest_through_stockade_run(vm_ready, tmp_path):
    """One command, one guest; the policy's limits hold inside it (real attempts)."""
    before = _qemus()
    policy = merge(_vm_policy("workspace-write"), {"limits": {
        "memory": "256MiB", "file_size": "1MiB", "pids": 64}})
    script = ("ls /sys/class/net; cat /proc/sys/kernel/pid_max; "
              "head -c 2000000 /dev/zero > big; echo wrote=$?; "
              "python3 -c 'bytearray(300 << 20)' 2>&1 | tail -n 1")
    r = stockade.run(["sh", "-c", script], policy, workspace=tmp_path)
    assert r.backend == "qemu-vm", r
    lines = r.stdout.decode().splitlines()
    assert lines[:2] == ["lo", "364"], r  # pid_max: pids + 300
    assert lines[2] != "wrote=0" and (tmp_path / "big").stat().st_size == 1 << 20
    assert lines[3] == "MemoryError", r  # the guest has 512 MiB: only the limit refuses this
    assert not _qemus() - before  # the guest is gone with the run
    with pytest.raises(UsageError):
        stockade.run(["true"], _vm_policy(), backend="linux")


def test_a_vm_command_takes_its_input_and_merges_stderr_as_subprocess_does(vm_ready, tmp_path):
    # (the guest is a backend like any other: the manager's streams, the caller's choices)
    r = stockade.run(["sh", "-c", "cat; echo err >&2"], _vm_policy(), workspace=tmp_path,
                     input=b"in\n", stderr=stockade.STDOUT)
    assert (r.backend, r.exit_code, r.stdout, r.stderr) == ("qemu-vm", 0, b"in\nerr\n", None)


def test_the_daemon_keeps_a_vm_session_across_clients(vm_ready, tmp_path):
    """A vm policy in the daemon gets a guest, which outlives the client thread that booted it
    (QEMU's parent-death signal is bound to a long-lived thread), and is gone when stopped."""
    before = _qemus()
    server = Daemon(str(tmp_path / "run" / "daemon.sock"), idle=600)
    server.bind()
    serving = threading.Thread(target=server.serve)
    serving.start()
    try:
        client = DaemonClient(server.path)
        policy = _vm_policy("workspace-write")
        client.start("guest", policy=policy, workspace=tmp_path)
        assert isinstance(server._sessions["guest"].sandbox, qemu.VmSandbox)
        started = _qemus() - before
        assert len(started) == 1
        time.sleep(0.5)  # the booting client's thread has ended by now
        first = client.run("guest", ["sh", "-c", "echo one > made"], policy=policy,
                           workspace=tmp_path)
        again = client.run("guest", ["cat", "made"], policy=policy, workspace=tmp_path)
        assert (first.backend, again.stdout) == ("qemu-vm", b"one\n")
        assert _qemus() - before == started
        assert client.stop("guest")
        assert not _qemus() & started
    finally:
        server.stop()
        serving.join(30)


class _ClosingServer:
    """A loopback server that answers every connection and then closes it: a plain HTTP
    response whose body ends where the connection does (no Content-Length), or, to a client
    that says "wait", whatever it sent once it half-closed (so its end must arrive too)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(65536)
                if head.startswith(b"wait"):
                    while chunk := conn.recv(65536):
                        head += chunk
                    conn.sendall(b"got " + head)
                else:
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                                 b"the whole body\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept above
        self.listener.close()


@pytest.fixture(scope="module")
def allowlist_guest(vm_ready, tmp_path_factory):
    """One allowlist guest for the tests below (a boot costs ~10 s): it may reach a
    `python -m http.server` and a _ClosingServer on loopback, by address or through the
    resolver hook as allowed.test; it yields (sandbox, http.server's port, _ClosingServer)."""
    workspace = tmp_path_factory.mktemp("vm-allowlist")
    # (-u: its "Serving HTTP on ... port N" line is read before it serves anything)
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0",
                               "--bind", "127.0.0.1"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, cwd=workspace, text=True)
    closing = _ClosingServer()
    try:
        port = int(server.stdout.readline().split(" port ")[1].split()[0])
        policy = merge(_vm_policy(), {"network": {"mode": "allowlist", "allow": [
            f"127.0.0.1:{port}", f"allowed.test:{port}", f"127.0.0.1:{closing.port}"]}})
        with qemu.VmSandbox(policy, workspace=workspace,
                            resolver=lambda host: ["127.0.0.1"] if host == "allowed.test"
                            else []) as sb:
            yield sb, port, closing
    finally:
        closing.close()
        server.kill()
        server.wait()


def test_an_allowlist_guest_goes_out_only_through_the_proxy(allowlist_guest):
    """The proxy answers at 10.0.2.100:3128; an allowed address (literal, or a name through the
    resolver hook) is reached; a denied name gets 403 and is in the Result; the user-mode
    network's host alias and DNS server (which `restrict=on` closes) are not reached, and
    nothing else is routed."""
    sb, port, _ = allowlist_guest
    code = textwrap.dedent(f"""
        import os, socket, urllib.request
        print(os.environ["HTTP_PROXY"])
        for url in ("http://127.0.0.1:{port}/", "http://allowed.test:{port}/",
                    "http://denied.test/"):
            try:
                print(urllib.request.urlopen(url, timeout=20).status)
            except OSError as exc:
                print(getattr(exc, "code", exc))
        for address in (("10.0.2.2", {port}), ("10.0.2.3", 53), ("127.0.0.1", {port})):
            try:
                socket.create_connection(address, timeout=5)
                print("reached")
            except OSError as exc:
                print(exc.errno)
        dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns.settimeout(3)
        dns.sendto(bytes.fromhex("abcd01000001000000000000076578616d706c650000010001"),
                   ("10.0.2.3", 53))
        try:
            print(len(dns.recv(512)))
        except OSError:
            print("silent")
        try:
            socket.create_connection(("10.0.3.1", 80), timeout=5)
        except OSError as exc:
            print(exc.errno)
    """)
    r = sb.run(["python3", "-c", code], timeout=120)
    refused, unreachable = str(errno.ECONNREFUSED), str(errno.ENETUNREACH)
    assert r.stdout.decode().split() == [
        "http://10.0.2.100:3128", "200", "200", "403", refused, refused, refused, "silent",
        unreachable], r
    assert [(d["host"], d["decision"]) for d in r.network_log] == [("denied.test", "deny")]
    assert [v.kind for v in r.violations] == ["network.denied"]


def test_a_connection_through_the_proxy_ends_when_the_server_ends_it(allowlist_guest):
    """curl and wget read a response whose body ends with the connection; a client that
    half-closes gets its answer and then the end: each finishes at once, the end passed on
    through the guest's relay (stockade/vm/egress.py) both ways, not at the timeout."""
    sb, _, closing = allowlist_guest
    url = f"http://127.0.0.1:{closing.port}/"
    tunnel = textwrap.dedent(f"""
        import socket
        conn = socket.create_connection(("10.0.2.100", 3128), timeout=20)
        conn.sendall(b"CONNECT 127.0.0.1:{closing.port} HTTP/1.1\\r\\n\\r\\n")
        head = b""
        while not head.endswith(b"\\r\\n\\r\\n"):
            head += conn.recv(1)
        conn.sendall(b"wait for my end")
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        print(head.split()[1].decode(), answer.decode())
    """)
    for argv, expected in ((["curl", "-sS", url], b"the whole body\n"),
                           (["wget", "-qO-", url], b"the whole body\n"),
                           (["python3", "-c", tunnel], b"200 got wait for my end\n")):
        began = time.monotonic()
        r = sb.run(argv, timeout=30)
        assert (r.exit_code, r.stdout, r.timed_out) == (0, expected, False), r
        assert time.monotonic() - began < 10, (argv[0], r)


def test_the_command_line_runs_a_guest_when_asked(vm_ready, tmp_path, capfd):
    from stockade.cli import main

    status = main(["run", "--containment", "vm", "--preset", "read-only", "--workspace",
                   str(tmp_path), "--", "sh", "-c", "ls /sys/class/net; exit 5"])
    assert (status, capfd.readouterr().out.split()) == (5, ["lo"])  # no NIC under "none"


# --- escapes a command in a real guest attempts (each must fail, and the host stay as it was) ---

def _snapshot(*tops) -> dict:
    """Every file's and directory's mode, extended attributes and content (files: SHA-256;
    directories: their entries) under `tops`, read on the host: what a guest must not change."""
    found = {}
    for top in map(str, tops):
        for dirpath, _, filenames in os.walk(top):
            for name in ["", *filenames]:
                path = os.path.join(dirpath, name) if name else dirpath
                info = os.lstat(path)
                attrs = {a: os.getxattr(path, a, follow_symlinks=False)
                         for a in os.listxattr(path, follow_symlinks=False)}
                if name:
                    with open(path, "rb") as f:
                        content = hashlib.sha256(f.read()).hexdigest()
                else:
                    content = sorted(os.listdir(path))
                found[path] = (info.st_mode, info.st_uid, attrs, content)
    return found


def _attempts(sb, workspace, attempts: list[str]) -> dict[str, int]:
    """Each shell command's exit status, run one by one in the guest from `workspace`."""
    return {attempt: sb.run(["sh", "-c", attempt], cwd=workspace).exit_code
            for attempt in attempts}


def test_the_command_cannot_set_the_guest_kernels_helpers(vm_ready, tmp_path):
    """As root (the guest's uid is the host user's), a command tries to make the guest kernel
    run its program with every capability: a core_pattern pipe, the modprobe and hotplug
    helpers, sysrq, and a fresh /proc in new namespaces. Every write fails, a crash, a module
    request and a uevent run nothing, and the denied file it would have read stays hidden."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("host secret\n")
    helper = workspace / "helper"
    helper.write_text(f"#!/bin/sh\necho \"$@\" >> {workspace}/ran\n"
                      f"umount -l {outside}/secret; cat {outside}/secret > {workspace}/leak\n")
    helper.chmod(0o755)
    base = _vm_policy("offline-build")  # exec_from_write: the helper could run from there
    policy = merge(base, {"filesystem": {"read": [*base.filesystem.read, str(outside)],
                                         "deny": [str(outside / "secret")]}})
    before = _snapshot(outside)
    code = textwrap.dedent(f"""
        import os, socket, subprocess, time
        print(os.getuid())
        for path, value in (("/proc/sys/kernel/core_pattern", "|{helper} core"),
                            ("/proc/sys/kernel/modprobe", "{helper}"),
                            ("/proc/sys/kernel/hotplug", "{helper}"),
                            ("/sys/kernel/uevent_helper", "{helper}"),
                            ("/proc/sys/kernel/modules_disabled", "0"),
                            ("/proc/sysrq-trigger", "h"),
                            ("/sys/class/mem/null/uevent", "add")):
            try:
                with open(path, "w") as f:
                    f.write(value)
                print(path, "written")
            except OSError as exc:
                print(path, exc.errno)
        subprocess.run(["sh", "-c", "kill -SEGV $$"])
        try:
            socket.socket(5, socket.SOCK_DGRAM)  # AF_APPLETALK: a module the guest lacks
        except OSError:
            pass
        fresh = subprocess.run(["unshare", "-U", "-r", "-m", "-p", "-f", "--mount-proc", "sh",
                                "-c", "echo '|{helper} ns' > /proc/sys/kernel/core_pattern"])
        print("unshare", "written" if fresh.returncode == 0 else "refused")
        time.sleep(3)  # a helper the kernel started would have run by now
        for name in ("core_pattern", "modprobe", "modules_disabled"):
            print(name, repr(open("/proc/sys/kernel/" + name).read().strip()))
    """)
    host_pattern = open("/proc/sys/kernel/core_pattern").read()
    with qemu.VmSandbox(policy, workspace=workspace) as sb:
        r = sb.run(["python3", "-c", code], cwd=workspace, timeout=120)
        secret = sb.run(["cat", str(outside / "secret")])
    lines = r.stdout.decode().splitlines()
    assert lines[0] == str(os.getuid()), r  # as root here: uid 0 in the guest
    writes = dict(line.rsplit(" ", 1) for line in lines[1:9])
    assert [path for path, outcome in writes.items() if outcome == "written"] == [], r
    assert writes["unshare"] == "refused", r
    assert not (workspace / "ran").exists() and not (workspace / "leak").exists()
    assert secret.exit_code == 0 and secret.stdout == b""  # still masked (/dev/null)
    values = dict(line.split(" ", 1) for line in lines[9:])
    assert not values["core_pattern"].strip("'").startswith("|"), values
    assert values["modprobe"] == "''" and values["modules_disabled"] == "'1'", values
    assert _snapshot(outside) == before
    assert open("/proc/sys/kernel/core_pattern").read() == host_pattern


@pytest.fixture(scope="module")
def planted(vm_ready, tmp_path_factory):
    """A guest whose workspace was prepared before boot by someone hostile: a hard link to a
    file outside every root, a nested `.git`, a `.git` file and the gitdir it names."""
    top = tmp_path_factory.mktemp("vm-planted")
    workspace, outside = top / "ws", top / "outside"
    for directory in (workspace / "deep", outside, workspace / "a" / "b" / ".git" / "hooks",
                      workspace / "wt", workspace / "gitdirs" / "wt" / "hooks"):
        directory.mkdir(parents=True)
    (outside / "target").write_text("outside, original\n")
    os.link(outside / "target", workspace / "linked")
    os.link(outside / "target", workspace / "deep" / "linked")
    (workspace / "a" / "b" / ".git" / "config").write_text("[core]\n")
    (workspace / "wt" / ".git").write_text("gitdir: ../gitdirs/wt\n")
    (workspace / "gitdirs" / "wt" / "HEAD").write_text("ref: refs/heads/main\n")
    sb = qemu.VmSandbox(preset="workspace-write", workspace=workspace)
    yield sb, workspace, outside
    sb.close()


def test_a_hard_link_to_a_file_outside_every_root_is_not_written_through(planted):
    sb, workspace, outside = planted
    before = _snapshot(outside)
    failed = _attempts(sb, workspace, [
        "echo pwned > linked", "echo pwned >> deep/linked", "truncate -s 0 linked",
        "chmod 666 linked", "python3 -c \"open('deep/linked', 'r+b').write(b'pwned')\"",
        "ln linked alias && echo pwned > alias"])
    assert [a for a, status in failed.items() if status == 0] == [], failed
    assert _snapshot(outside) == before
    assert (outside / "target").read_text() == "outside, original\n"
    r = sb.run(["sh", "-c", "echo fine > ordinary && cat linked"], cwd=workspace)
    assert (r.exit_code, r.stdout) == (0, b"outside, original\n"), r  # readable, not writable
    assert (workspace / "ordinary").read_text() == "fine\n"


def test_a_nested_repository_a_git_file_and_its_gitdir_are_guarded(planted):
    """(Their config, hooks and pointers: the rest of a `.git` is writable, as on the Linux
    backend.)"""
    sb, workspace, _ = planted
    protected = [workspace / "a", workspace / "wt", workspace / "gitdirs"]
    before = _snapshot(*protected)
    failed = _attempts(sb, workspace, [
        "echo '[x]' >> a/b/.git/config", "touch a/b/.git/hooks/post-checkout",
        "echo 'gitdir: /tmp/mine' > wt/.git", "echo x >> gitdirs/wt/config",
        "touch gitdirs/wt/hooks/pre-commit", "rm -f a/b/.git/config",
        # renaming a directory above a protected name away, to plant another in its place
        "mv a/b/.git a/b/old", "mv a/b a/moved", "mv a moved", "mv wt/.git wt/old",
        "mv gitdirs/wt gitdirs/old", "mv gitdirs moved"])
    assert [a for a, status in failed.items() if status == 0] == [], failed
    assert _snapshot(*protected) == before
    r = sb.run(["sh", "-c", "echo fine > a/b/ordinary && cat a/b/ordinary"], cwd=workspace)
    assert (r.exit_code, r.stdout) == (0, b"fine\n"), r  # beside a protected name: writable


def test_a_denied_path_and_its_9p_mask_cannot_be_renamed_away(vm_ready, tmp_path):
    """The guest pins the directories above a hidden path as the Linux backend does: without
    it, `mv conf x` took the mask along and a later guest read x/gh/hosts.yml in the clear."""
    secret = tmp_path / "conf" / "gh" / "hosts.yml"
    secret.parent.mkdir(parents=True)
    secret.write_text("HOSTSSECRET\n")
    policy = merge(stockade.preset("workspace-write"),
                   {"filesystem": {"deny": [str(secret)]}})
    before = _snapshot(tmp_path)
    with qemu.VmSandbox(policy, workspace=tmp_path) as sb:
        failed = _attempts(sb, tmp_path, ["mv conf/gh conf/moved", "mv conf moved",
                                          "rmdir conf/gh"])
        r = sb.run(["sh", "-c", "mv conf moved; cat moved/gh/hosts.yml conf/gh/hosts.yml"],
                   cwd=tmp_path)  # (a hidden file reads as /dev/null)
    assert [a for a, status in failed.items() if status == 0] == [], failed
    assert b"HOSTSSECRET" not in r.stdout + r.stderr and b"busy" in r.stderr, r
    assert _snapshot(tmp_path) == before


def test_git_works_in_a_guest_and_what_makes_it_run_code_stays_read_only(vm_ready, tmp_path):
    """A repository made on the host, with a linked worktree, a file its config includes and
    a denied file in `.git`: in the guest, git commits, branches, stashes and adds a worktree
    (in a nested repository too); writing its hooks, its config, the include or the worktree's
    pointers fails, as does renaming `.git`; the denied file stays hidden; on the host only
    what git wrote changed."""
    from test_linux_git import IN_SANDBOX, git

    workspace = tmp_path / "ws"
    workspace.mkdir()
    git(workspace, "init", "-q")
    git(workspace, "commit", "-q", "--allow-empty", "-m", "one")
    git(workspace, "worktree", "add", "-q", "wt")
    git(workspace, "config", "include.path", "../shared.gitconfig")
    (workspace / "shared.gitconfig").write_text("[alias]\n\tst = status\n")
    (workspace / ".git" / "credentials").write_text("token\n")
    (workspace / "nested").mkdir()
    git(workspace / "nested", "init", "-q")
    kept = [workspace / ".git" / name for name in ("config", "worktrees/wt/commondir",
                                                   "worktrees/wt/gitdir")]
    kept += [workspace / "shared.gitconfig", workspace / "wt" / ".git"]
    before = {path: path.read_bytes() for path in kept}, _snapshot(workspace / ".git" / "hooks")
    policy = merge(_vm_policy("workspace-write"),
                   {"filesystem": {"deny": [str(workspace / ".git" / "credentials")]}})
    with qemu.VmSandbox(policy, workspace=workspace) as sb:
        job = sb.run(["sh", "-c", IN_SANDBOX + """
            echo b > b; g add b; g commit -qm two; g branch topic
            echo c >> b; g stash -q; g stash pop -q; g commit -qam three
            g worktree add -q wt2; cd nested; g commit -q --allow-empty -m in-nested
        """], cwd=workspace)
        failed = _attempts(sb, workspace, [
            "echo x > .git/hooks/pre-commit", "echo '[core] fsmonitor = x' >> .git/config",
            "echo '[core] fsmonitor = x' >> shared.gitconfig", "grep token .git/credentials",
            "echo /tmp > .git/worktrees/wt/commondir", "echo x > .git/worktrees/wt/gitdir",
            "echo 'gitdir: /tmp' > wt/.git", "echo x > nested/.git/hooks/pre-commit",
            "mv .git old", "mv .git/hooks .git/old"])
    assert job.exit_code == 0, job.stderr.decode()
    assert [a for a, status in failed.items() if status == 0] == [], failed
    assert ({path: path.read_bytes() for path in kept},
            _snapshot(workspace / ".git" / "hooks")) == before
    assert git(workspace, "log", "--format=%s").split() == ["three", "two", "one"]
    assert git(workspace / "nested", "log", "--format=%s").split() == ["in-nested"]
    assert (workspace / "wt2" / ".git").is_file()


def test_a_killed_owner_leaves_no_qemu_and_its_directory_is_reconciled(
        vm_ready, tmp_path, tmp_path_factory, monkeypatch):
    """The process owning a guest is SIGKILLed: its QEMU dies with it, and the next start of
    a guest (which reconciles the launch ledger) removes the directory it left."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    temp = tmp_path_factory.mktemp("t", numbered=True)
    assert len(f"{temp}/stockade-vm-{24 * '0'}/agent.sock") < 108  # AF_UNIX's limit
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    code = ("import sys, time; from stockade.vm import qemu; "
            "sb = qemu.VmSandbox(preset='read-only', workspace=sys.argv[1]); "
            "print(sb._session.handle.workdir, sb.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(workspace)], text=True,
                             stdout=subprocess.PIPE)
    try:
        workdir, pid = owner.stdout.readline().split()
    finally:
        owner.kill()
        owner.wait()
    assert os.path.dirname(workdir) == str(temp) and os.path.isdir(workdir)
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "QEMU outlived its owner"
    with qemu.VmSandbox(preset="read-only", workspace=workspace) as sb:
        assert sb.run(["true"]).exit_code == 0
        left = set(os.listdir(temp)) - {os.path.basename(sb._session.handle.workdir)}
    assert left == set() and os.listdir(temp) == [], left


def test_a_write_root_granted_inside_a_protected_name_is_honoured_in_the_guest(vm_ready,
                                                                           tmp_path):
    """`home` writable, its `.codex` protected, `home/.codex/v/t` granted write: the exact
    grant wins, as on the Linux backend (the protected name's read-only bind hid its share:
    the write failed), and what is protected inside it stays so, as does the rest of
    `.codex`."""
    home = tmp_path / "home"
    (home / ".codex" / "v" / "t" / ".agents").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text("original\n")
    before = _snapshot(home)
    policy = merge(_vm_policy("workspace-write"),
                   {"filesystem": {"write": ["{workspace}", "{workspace}/.codex/v/t"]}})
    with qemu.VmSandbox(policy, workspace=home) as sb:
        status = _attempts(sb, home, ["echo granted > .codex/v/t/made",
                                      "echo pwned > .codex/config.toml",
                                      "echo pwned > .codex/new",
                                      "echo pwned > .codex/v/t/.agents/new"])
    assert status.pop("echo granted > .codex/v/t/made") == 0, status
    assert 0 not in status.values(), status
    assert (home / ".codex" / "v" / "t" / "made").read_text() == "granted\n"
    (home / ".codex" / "v" / "t" / "made").unlink()
    assert _snapshot(home) == before


def test_a_guest_never_reaches_another_workspaces_private_home(vm_ready, tmp_path,
                                                               monkeypatch):
    """Issue 29 H1 in a guest: the seal key's directory (so the private homes' directory
    beside it) lies in workspace A; a real command of A lists the homes and tries to plant a git
    configuration in workspace B's home and to remove it: it sees its own home alone there,
    every attempt fails, B's home is as it was, and A's own home works."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    state = a / "state"
    monkeypatch.setattr(statedir, "key_dir", lambda: str(state))
    b_home = home_for(os.path.realpath(b), str(state))
    ensure_home(b_home)  # (as B's first run makes it)
    homes = os.path.dirname(b_home)
    before = _snapshot(b_home)
    with qemu.VmSandbox(stockade.preset("workspace-write"), workspace=a) as sb:
        listed = sb.run(["ls", "-A", homes], cwd=a)
        failed = _attempts(sb, a, [f"echo x > {b_home}/.config/git/config",
                                   f"mkdir {homes}/planted", f"rm -r {b_home}",
                                   f"mv {homes} {a}/moved"])
        own = sb.run(["sh", "-c", 'echo kept > "$HOME/cache" && cat "$HOME/cache"'], cwd=a)
    a_home = home_for(os.path.realpath(a), str(state))
    assert listed.stdout.decode().split() == [os.path.basename(a_home)], listed
    assert [attempt for attempt, status in failed.items() if status == 0] == [], failed
    assert own.stdout == b"kept\n" and open(os.path.join(a_home, "cache")).read() == "kept\n"
    assert _snapshot(b_home) == before and not os.path.exists(f"{homes}/planted")
