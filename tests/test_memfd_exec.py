"""exec_from_write = false against written memory (issue 29 part 6, F12): a program copied into a
memfd runs by no route, root or rootless: fexecve (execveat AT_EMPTY_PATH), execve of
/proc/self/fd/N and /dev/fd/N, a link in the workspace to /proc/self/fd/N, a memfd asked for
MFD_EXEC, one made executable by fchmod. Two layers, each shown to hold alone: pid 1 makes the
command's memfds itself, sealed non-executable (memfd_seal), and judges every execve/execveat
(exec_watch); as root vm.memfd_noexec = 2 is a third. The payload is a copy of touch: the
host checks that its file was never made."""

from __future__ import annotations

import errno
import textwrap

import pytest
from conftest import PYTHON
from test_helpers_boundary import run_with

from stockade.linux.backend import LinuxBackend

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]

ATTACK = textwrap.dedent("""
    import errno, os, shutil, sys
    marker = sys.argv[1]
    touch = shutil.which("touch")

    def payload(flags=0):
        fd = os.memfd_create("payload", flags)
        with open(touch, "rb") as f:
            os.write(fd, f.read())
        return fd

    def run(name, how):
        pid = os.fork()
        if pid == 0:
            try:
                how()
            except OSError as exc:
                os._exit(100 + exc.errno)
            os._exit(99)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(name, "ran" if code == 0 else code - 100 if code >= 100 else f"exit {code}")

    def by_path(template, flags=0):
        fd = payload(flags)
        os.execv(template.format(fd), ["touch", marker])

    def by_link():
        fd = payload()
        link = os.path.join(os.path.dirname(marker), "link")
        os.symlink(f"/proc/self/fd/{fd}", link)
        os.execv(link, ["touch", marker])

    def chmodded():
        fd = payload()
        os.fchmod(fd, 0o755)
        os.execve(fd, ["touch", marker], dict(os.environ))

    run("fexecve", lambda: os.execve(payload(), ["touch", marker], dict(os.environ)))
    run("proc", lambda: by_path("/proc/self/fd/{}"))
    run("devfd", lambda: by_path("/dev/fd/{}"))
    run("link", by_link)
    run("mfd_exec", lambda: os.execve(payload(0x10), ["touch", marker], dict(os.environ)))
    run("chmod", chmodded)
""")
ROUTES = ("fexecve", "proc", "devfd", "link", "mfd_exec", "chmod")


def attack(workspace, backend: LinuxBackend | None = None, **changes) -> dict[str, str]:
    marker = workspace / "ran"
    argv = [PYTHON, "-c", ATTACK, str(marker)]
    r = run_with(backend or LinuxBackend(), argv, workspace, name="workspace-write-no-exec",
                 **changes)
    assert r.exit_code == 0, r.stderr
    seen = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert set(seen) == set(ROUTES), r.stdout
    ran = marker.exists()  # the host's own look: did the payload run?
    assert ran == ("ran" in seen.values()), (seen, ran)
    for name in ("link", "ran"):
        (workspace / name).unlink(missing_ok=True)
    return seen


REFUSED = {route: str(errno.EACCES) for route in ROUTES} | {"chmod": str(errno.EPERM)}


def test_no_route_runs_a_memfd(ws):
    """Root and rootless: every route refused, and the payload never ran."""
    workspace, _ = ws
    seen = attack(workspace)
    assert {k: v for k, v in seen.items() if k != "chmod"} == \
        {k: v for k, v in REFUSED.items() if k != "chmod"}
    assert seen["chmod"] in (str(errno.EPERM), str(errno.EACCES))


@pytest.mark.parametrize("left", ["memfd_seal", "exec_watch"])
def test_each_layer_holds_alone(ws, left):
    """With every other memfd layer off (as root vm.memfd_noexec too), the one left still
    refuses every route."""
    workspace, _ = ws
    other = {"memfd_seal": "exec_watch", "exec_watch": "memfd_seal"}[left]
    seen = attack(workspace, LinuxBackend(weaken=frozenset({other, "memfd_noexec"})))
    assert "ran" not in seen.values(), seen
    assert seen["fexecve"] == seen["proc"] == str(errno.EACCES), seen


def test_the_attack_is_real(ws):
    """Without the layers, or with exec_from_write = true, the memfd runs (the payload's file
    appears on the host)."""
    workspace, _ = ws
    weak = attack(workspace, LinuxBackend(weaken=frozenset({"memfd_seal", "exec_watch",
                                                             "memfd_noexec"})))
    assert weak["fexecve"] == weak["proc"] == weak["chmod"] == "ran", weak
    allowed = attack(workspace, exec_from_write=True)
    assert allowed["fexecve"] == allowed["proc"] == "ran", allowed
