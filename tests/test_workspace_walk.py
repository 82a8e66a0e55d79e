"""What a workspace holds cannot break later launches (issue 29): every write root is walked at
each launch for protected names, multiply-linked files and socket files (stockade/linux/protect.py),
and each of those is re-mounted or masked. A tree thousands of directories deep, or more hard
links than the launching process may hold descriptors, is walked and covered, and launches go
on; a path too long for the kernel to mount on is refused, typed, before anything runs. Real
children; what happened is checked on the host."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import py

from stockade.errors import UnenforceableError

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]


def deep_tree(top, depth: int, name: str = "d") -> str:
    """`depth` nested directories `name` below `top`, made by descriptor (a path that long
    cannot be passed whole); their path relative to `top`."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return "/".join([name] * depth)


def test_a_tree_1500_deep_breaks_no_later_launch_and_its_depths_stay_protected(ws):
    """A first run makes the tree (os.fwalk recursed: every later launch failed,
    launcher_failed); the host puts a protected name at its bottom, which the next run
    cannot write."""
    workspace, _ = ws
    made = py(textwrap.dedent("""
        import os
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
    """), workspace)
    assert made.exit_code == 0, made.stderr
    bottom = workspace / ("/".join(["d"] * 1500))
    (bottom / ".envrc").write_text("host's\n")
    r = py(textwrap.dedent(f"""
        try:
            open({str(bottom / ".envrc")!r}, "w").write("sandbox's")
            print("written")
        except OSError as exc:
            print(exc.errno)
    """), workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() != b"written"
    assert (bottom / ".envrc").read_text() == "host's\n"


def test_a_path_longer_than_the_kernel_takes_is_refused_typed(ws):
    """Nothing below it could be covered by a mount: the launch is refused, naming the limit,
    and the command never runs."""
    workspace, outside = ws
    deep_tree(workspace, 4200 // 3, "dd")
    with pytest.raises(UnenforceableError) as refused:
        py(f"open({str(outside / 'ran')!r}, 'w')", workspace,
           write=[str(workspace), str(outside)])
    assert refused.value.code == "unenforceable:filesystem.write", refused.value
    assert "4095" in str(refused.value)
    assert not (outside / "ran").exists()


@pytest.mark.parametrize("overlay", [False, True], ids=["direct", "overlay"])
def test_more_hard_links_than_descriptors_break_no_launch_and_stay_read_only(ws, overlay):
    """Each multiply-linked file is re-mounted read-only (its other name may lie outside every
    root). An owner that may hold 256 descriptors, with 300 links in its workspace to a file
    outside: the launch failed with EMFILE (a descriptor held per linked file); now it runs,
    and no link writes the outside file (in an overlaid workspace too, where each is covered by
    the real file, found again below the real directory)."""
    workspace, outside = ws
    target = outside / "target"
    target.write_text("outside\n")
    for index in range(300):
        os.link(target, workspace / f"link{index}")
    owner = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from conftest import PYTHON, policy_for
        import stockade
        code = '''
        import os
        for name in sorted(os.listdir(".")):
            try:
                open(name, "a").write("sandbox")
                print("written", name)
            except OSError:
                pass
        print("done")
        '''
        r = stockade.run([PYTHON, "-c", code], policy_for(), workspace={str(workspace)!r},
                         overlay={overlay!r})
        sys.stdout.write(r.stdout.decode())
        sys.exit(r.exit_code)
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, timeout=120)
    assert owner.returncode == 0, owner.stderr.decode()[-2000:]
    assert owner.stdout.decode().split() == ["done"], owner.stdout
    assert target.read_text() == "outside\n"
