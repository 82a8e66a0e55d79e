"""Spares prepared ahead for a launch's view (zygote.py): a run of launches with one policy
gets sandboxes whose mounts and confinement were made before the launch. Real children check
that such a sandbox is as closed as a fresh one, that it never carries another launch's own
state, and that a host change since it was prepared (a new protected name, a new denied path,
a new hard link, a re-made root) is seen by the next launch."""

from __future__ import annotations

import dataclasses
import os
import socket
import textwrap
import threading
import time
from collections.abc import Callable

import pytest
from conftest import FORK_UNTIL_REFUSED, PYTHON, marked, policy_for, sandbox

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux import frame, launcher, seccomp, template
from stockade.linux.backend import LinuxBackend

pytestmark = pytest.mark.usefixtures("linux")


def in_a_prepared_spare(launch: Callable[[], stockade.Result]) -> stockade.Result:
    """Launch until one runs in a prepared spare; its result. The first launch of a view
    cannot, and a launch that comes while the spare is still being made gets another: on a
    busy machine that takes a few tries."""
    for _ in range(40):
        r = launch()
        if r.enforced.get("prepared_ahead"):
            return r
        time.sleep(0.05)
    raise AssertionError("no launch ran in a prepared spare")


def prepared(workspace, argv=("true",), **changes):
    return in_a_prepared_spare(lambda: sandbox(list(argv), workspace, **changes))


def test_a_run_of_launches_uses_prepared_spares(ws):
    workspace, _ = ws
    first = sandbox(["true"], workspace)
    assert first.enforced["prepared_ahead"] is False
    assert prepared(workspace).exit_code == 0


def test_a_prepared_spare_reports_memory_exhaustion_as_a_fresh_one_does(ws):
    """The memory watch is the supervisor's, which a spare cloned from a view template runs."""
    workspace, _ = ws
    code = [PYTHON, "-c", "bytearray(1 << 30)"]
    fresh = sandbox(code, workspace, memory=256 << 20)
    spared = prepared(workspace, code, memory=256 << 20)
    for r in (fresh, spared):
        assert r.returncode == 1 and [v.kind for v in r.violations] == ["limits.memory"], r


def test_a_prepared_sandbox_is_as_closed_as_a_fresh_one(ws):
    """Writes outside the roots, reads outside them, a namespace, a TCP connection to a host
    listener: all refused in a prepared sandbox, and nothing outside changes."""
    workspace, outside = ws
    (outside / "secret").write_text("TOPSECRET")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = (f"cat {outside}/secret; echo pwned > {outside}/new; "
                  f"unshare -U true && echo UNSHARED; "
                  f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED; "
                  "echo done")
        r = prepared(workspace, ["bash", "-c", script])
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert r.stdout == b"done\n", r.stdout
    assert b"TOPSECRET" not in r.stdout
    assert sorted(os.listdir(outside)) == ["secret"]
    assert r.enforced["landlock"] and r.enforced["seccomp"]


def test_a_prepared_sandbox_has_only_its_own_launchs_environment(ws, monkeypatch):
    """The spare was prepared after a launch with another environment, argv and working
    directory: none of it reaches this one."""
    workspace, _ = ws
    (workspace / "sub").mkdir()
    monkeypatch.setenv("LANG", "C.UTF-8")
    base = policy_for()
    first = dataclasses.replace(base, env=dataclasses.replace(base.env, set=(("MARK", "first"),)))
    stockade.run(["true"], first, workspace=workspace)
    second = base
    r = in_a_prepared_spare(lambda: stockade.run(["sh", "-c", "echo ${MARK:-unset} $(pwd)"],
                                                 second, workspace=workspace,
                                                 cwd=workspace / "sub"))
    assert r.stdout.decode().split() == ["unset", str(workspace / "sub")]


def test_a_protected_name_made_after_a_launch_is_protected_at_the_next(ws):
    workspace, _ = ws
    prepared(workspace)  # a spare is now prepared for this view, made before .agents existed
    (workspace / ".agents").mkdir()
    (workspace / ".agents" / "rules").write_text("be careful\n")
    r = sandbox(["sh", "-c", "echo evil >> .agents/rules; echo evil > .agents/new"], workspace)
    assert r.exit_code != 0
    assert (workspace / ".agents" / "rules").read_text() == "be careful\n"
    assert sorted(os.listdir(workspace / ".agents")) == ["rules"]
    assert r.enforced["protected_mounts"] >= 1


def test_a_repository_made_after_a_launch_is_guarded_at_the_next(ws):
    """A `.git` made on the host after a view was prepared: its config (and the hooks
    directory made for it) are read-only at the next launch, its other files writable."""
    workspace, _ = ws
    prepared(workspace)
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    r = sandbox(["sh", "-c", "echo evil >> .git/config; echo evil > .git/hooks/pre-commit; "
                 "echo fine > .git/HEAD"], workspace)
    assert r.stderr.count(b"Read-only file system") == 2, r.stderr
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    assert os.listdir(workspace / ".git" / "hooks") == []
    assert (workspace / ".git" / "HEAD").read_text() == "fine\n"
    assert r.enforced["protected_mounts"] >= 2


@pytest.mark.parametrize("by", ["template", "skeleton"])
def test_a_view_prepared_ahead_makes_nothing_in_the_workspace(ws, by):
    """A view is prepared while no run goes on: a zygote's template once a run has started,
    built on after it returned, or a CLI server's skeleton; its owner may be removing the
    workspace meanwhile (`stockade demo` found `.git/config` made again while it removed its
    own: ENOTEMPTY). The git guard's empty `config` and `hooks/` are made by a launch only: a
    real template or skeleton prepared for a gitdir without them is not prepared, and makes
    nothing there."""
    workspace, _ = ws
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    request = compile_policy(policy_for(), ["true"], CompileContext.current(workspace))
    view = frame.view_frame(request, seccomp.compile_filter(), frozenset())
    skeleton = template.start(view) if by == "template" else launcher.start()
    with skeleton.handoff:
        if by == "skeleton":
            skeleton.handoff.send(b"V" + view)
        said = skeleton.handoff.recv(100)  # "M" once prepared; the end if it could not be
    os.waitid(os.P_PIDFD, skeleton.pidfd, os.WEXITED)
    os.close(skeleton.pidfd)
    assert os.listdir(workspace / ".git") == ["HEAD"]
    assert said == b""
    # the launch that needs them makes them
    r = sandbox(["sh", "-c", "echo evil > .git/hooks/pre-commit"], workspace)
    assert r.exit_code != 0 and os.listdir(workspace / ".git" / "hooks") == []


def test_an_include_added_after_a_launch_is_read_only_at_the_next(ws):
    """A prepared view of a repository; then its config includes a file in the work tree (and
    a hook appears): the next launch has a view of its own, in which both are read-only."""
    workspace, _ = ws
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    prepared(workspace)
    (workspace / "shared.gitconfig").write_text("[alias]\n")
    with open(workspace / ".git" / "config", "a") as f:
        f.write("[include]\n\tpath = ../shared.gitconfig\n")
    (workspace / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    r = sandbox(["sh", "-c", "echo evil >> shared.gitconfig; echo evil >> .git/hooks/pre-commit"],
                workspace)
    assert r.exit_code != 0 and r.stderr.count(b"Read-only file system") == 2, r.stderr
    assert not r.enforced["prepared_ahead"]
    assert (workspace / "shared.gitconfig").read_text() == "[alias]\n"
    assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == "#!/bin/sh\n"


def test_a_denied_path_made_after_a_launch_is_hidden_at_the_next(ws):
    """(In a read root: one absent in a write root is refused, since the command could make
    it; the host can still make one in a read root between two launches.)"""
    workspace, _ = ws
    deny = (str(workspace / "secret"),)
    prepared(workspace, name="read-only", deny=deny)  # prepared while nothing was there to hide
    (workspace / "secret").write_text("TOPSECRET")
    r = sandbox(["cat", "secret"], workspace, "read-only", deny=deny)
    assert r.exit_code != 0
    assert b"TOPSECRET" not in r.stdout


def test_a_hard_link_made_after_a_launch_is_read_only_at_the_next(ws):
    workspace, outside = ws
    (outside / "target").write_text("original")
    prepared(workspace)
    os.link(outside / "target", workspace / "alias")
    r = sandbox(["sh", "-c", "echo evil > alias"], workspace)
    assert r.exit_code != 0
    assert (outside / "target").read_text() == "original"


def test_a_root_re_made_after_a_launch_is_the_one_the_next_launch_writes(ws):
    """A spare's bind mount holds the directory it was made from. Re-made under the same path
    (perhaps with the same inode number), the new directory is the one the next launch must
    write: nothing may vanish into the deleted one."""
    workspace, _ = ws
    prepared(workspace)
    os.rmdir(workspace)
    workspace.mkdir()
    r = sandbox(["sh", "-c", "echo kept > out"], workspace)
    assert r.exit_code == 0, r.stderr
    assert (workspace / "out").read_text() == "kept\n"


def test_a_prepared_allowlist_sandbox_goes_out_only_through_its_proxy(ws, plain_server):
    """The proxy's listener of a prepared sandbox is made before the launch, in the sandbox's
    own network namespace: the allowed destination is reached through it, a direct connection
    is still refused, and the denial of another destination is in the result."""
    workspace, _ = ws
    port = plain_server.port
    base = policy_for("read-only")
    policy = dataclasses.replace(base, network=dataclasses.replace(
        base.network, mode="allowlist", allow=(f"127.0.0.1:{port}",)))
    code = textwrap.dedent(f"""
        import socket, urllib.request
        print(urllib.request.urlopen('http://127.0.0.1:{port}/via-proxy').status)
        try:
            socket.create_connection(('127.0.0.1', {port}), 2); print('DIRECT')
        except OSError:
            print('no-direct')
        try:
            urllib.request.urlopen('http://127.0.0.2:{port}/denied')
        except OSError:
            print('denied')
    """)
    r = in_a_prepared_spare(lambda: stockade.run([PYTHON, "-c", code], policy,
                                                 workspace=workspace))
    hits = [seen.path for seen in plain_server.seen]
    assert r.stdout.decode().split() == ["200", "no-direct", "denied"], r.stderr
    assert hits.count("/via-proxy") >= 1 and "/denied" not in hits
    assert [v.kind for v in r.violations] == ["network.denied"]


def test_spares_of_one_view_share_no_tmp_shm_or_processes(ws):
    """Spares of one view are cloned from one template (template.py): each still has its own
    /tmp, /dev/shm and processes. Here two prepared sandboxes run at once: the first leaves
    files in /tmp and /dev/shm and a process behind; the second sees none of it. (On a busy
    machine a spare may not be ready in time, and a launch then gets a sandbox of its own:
    the pair is tried again until both ran in spares; every try must see nothing.)"""
    workspace, _ = ws
    marker = f"987.{os.getpid()}"
    leave = f"echo first > /tmp/left; echo first > /dev/shm/left; exec sleep {marker}"
    look = (f"echo tmp $(ls -A /tmp); echo shm $(ls -A /dev/shm); "
            # (a pattern that does not match this command line itself)
            f"echo seen $(grep -l '987[.]{os.getpid()}' /proc/[0-9]*/cmdline 2>/dev/null)")
    for _ in range(10):
        prepared(workspace)  # this view's template is made, and its spares (zygote.PREPARED):
        time.sleep(0.5)  # now both are waiting, for the next two launches
        results: list[stockade.Result] = []
        first = threading.Thread(target=lambda into=results: into.append(
            sandbox(["sh", "-c", leave], workspace)))
        first.start()
        try:
            deadline = time.monotonic() + 10
            while not marked(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marked(marker), "the first sandbox never started"
            r = sandbox(["sh", "-c", look], workspace)
        finally:
            for pid in marked(marker):
                os.kill(pid, 9)
            first.join(30)
        lines = dict(line.partition(" ")[::2] for line in r.stdout.decode().splitlines())
        assert "left" not in lines["tmp"].split(), lines  # (only what leads to roots below /tmp)
        assert lines["shm"] == "" and lines["seen"] == "", lines
        if r.enforced["prepared_ahead"] and results and results[0].enforced["prepared_ahead"]:
            return
    raise AssertionError("two launches never both ran in prepared spares")


def test_sandboxes_outlive_the_template_they_were_cloned_from(ws):
    """A launch with another view replaces the template; a sandbox cloned from the old one
    runs on to its own end (a template that were the init of a pid namespace would take all
    its sandboxes with it)."""
    workspace, _ = ws
    results = []
    runner = threading.Thread(target=lambda: results.append(
        prepared(workspace, ["sh", "-c", "sleep 1; echo survived"])))
    runner.start()
    time.sleep(0.3)
    for _ in range(3):  # another view: its template replaces this one
        sandbox(["true"], workspace, "read-only")
    runner.join(30)
    assert results and (results[0].exit_code, results[0].stdout) == (0, b"survived\n")


def test_a_prepared_sandbox_has_its_own_pid_max_and_exact_process_limit(ws):
    workspace, _ = ws
    code = FORK_UNTIL_REFUSED + "print(open('/proc/sys/kernel/pid_max').read().strip())\n"
    r = prepared(workspace, [PYTHON, "-c", code], pids=3)
    assert r.exit_code == 0, r.stderr
    count, pid_max = r.stdout.split()
    assert pid_max == b"303"  # limits.RESERVED_PIDS + pids, in this sandbox's pid namespace
    if os.getuid() != 0:  # (RLIMIT_NPROC does not bind host root: see limits.py)
        assert count == b"3"
    with open("/proc/sys/kernel/pid_max") as f:
        assert f.read().strip() != "303"  # the host's is untouched


STATE = textwrap.dedent("""
    import socket
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(*(key + "=" + status[key].strip() for key in ("CapInh", "CapPrm", "CapEff",
          "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters")))
    mounts = {}
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        after = fields[fields.index("-") + 1:]
        mounts[fields[4]] = (fields[5], after[0], after[2])  # the last one there is seen
    for where in ("/proc", "/tmp", "/dev/shm", "/dev/pts"):
        options, kind, super_options = mounts[where]
        print(where, options, kind, ",".join(sorted(super_options.split(","))))
    print(socket.gethostname())
""")


def test_a_prepared_sandbox_is_confined_and_mounted_as_a_fresh_one_is(ws):
    """A spare cloned from a view template makes its own filesystems and confines itself in
    C (template.c, refresh.c, confine.c), not as a sandbox built at launch does (init.py,
    mnt.py): the capabilities, no_new_privs, seccomp, the mounts of /proc, /tmp, /dev/shm and
    /dev/pts and the hostname that its command sees are the same, with a memory limit that
    sizes /tmp and /dev/shm."""
    workspace, _ = ws
    fresh = sandbox([PYTHON, "-c", STATE], workspace, memory=256 << 20)
    assert fresh.enforced["prepared_ahead"] is False, fresh.enforced
    spared = prepared(workspace, [PYTHON, "-c", STATE], memory=256 << 20)
    assert fresh.exit_code == spared.exit_code == 0, (fresh.stderr, spared.stderr)
    assert spared.stdout == fresh.stdout
    lines = fresh.stdout.decode().splitlines()
    assert "CapEff=0000000000000000" in lines[0] and "CapBnd=0000000000000000" in lines[0]
    assert "NoNewPrivs=1" in lines[0] and "Seccomp=2" in lines[0]
    assert lines[1].startswith("/proc ro,") and "size=262144k" in lines[2], lines
    assert lines[-1] == "stockade"


def test_concurrent_launches_of_one_view_each_get_a_sandbox_of_their_own(ws):
    """Two callers launching one view back to back: the zygote hands each launch a ready
    spare, or promises it one still making itself ready (zygote.py), or builds it a fresh
    one. Whichever: every launch runs, in a /tmp and a process tree no other launch shares."""
    workspace, _ = ws
    script = "cat /tmp/mark 2>/dev/null; echo $$ > /tmp/mark; echo ok"
    results: list[stockade.Result] = []

    def caller() -> None:
        results.extend(sandbox(["sh", "-c", script], workspace) for _ in range(15))

    callers = [threading.Thread(target=caller) for _ in range(2)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(120)
    assert len(results) == 30
    assert all((r.exit_code, r.stdout) == (0, b"ok\n") for r in results), \
        [(r.exit_code, r.stdout, r.stderr) for r in results if r.stdout != b"ok\n"]
    assert sum(r.enforced["prepared_ahead"] for r in results) > 0


@pytest.mark.parametrize("weaken", ["seccomp", "privileges", "landlock"])
def test_a_layer_weakened_for_a_test_is_weakened_alike_in_a_prepared_sandbox(ws, weaken):
    """The evidence matrix weakens one layer at a time to show that its rows then fail: a
    spare cloned from a view template (template.c) leaves out exactly that layer too, as a
    sandbox built at launch does, and the others stay."""
    workspace, _ = ws
    backend = LinuxBackend(weaken=frozenset({weaken}))
    request = compile_policy(policy_for(), [PYTHON, "-c", STATE],
                             CompileContext.current(workspace))

    def launch() -> stockade.Result:
        return execute(backend, dataclasses.replace(request, request_id=os.urandom(16).hex()))

    fresh = launch()
    spared = in_a_prepared_spare(launch)
    assert fresh.exit_code == spared.exit_code == 0, (fresh.stderr, spared.stderr)
    assert fresh.enforced["prepared_ahead"] is False
    assert spared.enforced["weakened_for_testing"] == [weaken]
    assert spared.stdout == fresh.stdout
    status = spared.stdout.decode().splitlines()[0]
    assert ("Seccomp=2" in status) == (weaken != "seccomp")
    assert ("CapBnd=0000000000000000" in status) == (weaken != "privileges")


def test_a_prepared_sandbox_pins_the_directories_above_a_denied_path(ws):
    """The pins (protect.py) are mounts of the view: a spare cloned from its template has them
    too, and renaming the parents of a denied file fails there as in a fresh sandbox."""
    workspace, _ = ws
    (workspace / "conf" / "gh").mkdir(parents=True)
    (workspace / "conf" / "gh" / "hosts.yml").write_text("HOSTSSECRET")
    r = prepared(workspace, ["sh", "-c", "mv conf/gh conf/gh2; mv conf conf2; ls"],
                 deny=(str(workspace / "conf" / "gh" / "hosts.yml"),))
    assert r.stderr.count(b"Device or resource busy") == 2, r.stderr
    assert sorted(os.listdir(workspace)) == ["conf"]
    assert (workspace / "conf" / "gh" / "hosts.yml").read_text() == "HOSTSSECRET"


def test_a_prepared_sandbox_starts_in_its_own_launchs_hidden_working_directory(ws, tmp_path):
    """`read = ["/"]` from a directory below /tmp: the view mounts that directory (mnt.hidden_cwd),
    so a spare prepared from another one's launch is never given to this one."""
    workspace, _ = ws
    other = tmp_path / "other"
    other.mkdir()
    base = stockade.preset("read-only")
    policy = dataclasses.replace(base, filesystem=dataclasses.replace(
        base.filesystem, read=("/",), write=()))
    in_a_prepared_spare(lambda: stockade.run(["true"], policy, workspace=other))
    r = stockade.run(["pwd"], policy, workspace=workspace)
    assert r.exit_code == 0 and r.stdout == f"{workspace}\n".encode(), r.stderr
