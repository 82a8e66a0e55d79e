"""Git in a write root (`filesystem.git`): real children run git's everyday job on repositories
made on the host, which works, and try what would make git on the host run their code later or
use another gitdir or configuration, which fails; the host is checked to be unchanged."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from conftest import policy_for, sandbox, unavailable
from test_linux_fs import snapshot

import stockade
from stockade.errors import UnenforceableError
from stockade.policy import merge

pytestmark = pytest.mark.usefixtures("linux")

IDENTITY = ("-c", "user.name=t", "-c", "user.email=t@example.invalid")
# In the sandbox: git with an identity, and the job stops at the first failure.
IN_SANDBOX = "set -e; g() { git -c user.name=t -c user.email=t@example.invalid \"$@\"; }; "


def git(cwd, *args: str) -> str:
    """Run git on the host (outside any sandbox)."""
    if not shutil.which("git"):
        unavailable("git is not installed")
    done = subprocess.run(["git", *IDENTITY, "-c", "init.defaultBranch=main",
                           "-c", "protocol.file.allow=always", *args],
                          cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def repository(ws):
    """A repository made on the host as an agent's workspace would be: commits, a hook, an
    include in the work tree and one in the gitdir, a nested repository (hooks taken from its
    work tree by core.hooksPath), a submodule (a `.git` file and `.git/modules/sub`) and a
    linked worktree (a `.git` file, `.git/worktrees/wt`'s commondir and gitdir)."""
    workspace, outside = ws
    git(outside, "init", "-q", "upstream")
    git(outside / "upstream", "commit", "-q", "--allow-empty", "-m", "upstream")
    git(workspace, "init", "-q")
    (workspace / "a").write_text("a\n")
    git(workspace, "add", "a")
    git(workspace, "commit", "-qm", "one")
    git(workspace, "submodule", "add", "-q", str(outside / "upstream"), "sub")
    git(workspace, "commit", "-qm", "sub")
    git(workspace, "worktree", "add", "-q", "wt", "-b", "wt")
    (workspace / "repo.gitconfig").write_text("[alias]\n\tst = status\n")
    (workspace / ".git" / "branch.inc").write_text("[alias]\n\tco = checkout\n")
    git(workspace, "config", "include.path", "../repo.gitconfig")
    git(workspace, "config", "includeIf.onbranch:main.path", "branch.inc")
    nested = workspace / "nested"
    nested.mkdir()
    git(nested, "init", "-q")
    git(nested, "commit", "-q", "--allow-empty", "-m", "nested")
    (nested / "tree-hooks").mkdir()
    git(nested, "config", "core.hooksPath", "tree-hooks")
    hook = workspace / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return workspace


def test_the_everyday_git_job_works_under_workspace_write(repository):
    """add, commit, branch, stash, rebase, worktree add, and commits in a pre-existing linked
    worktree, a nested repository and a submodule: all in one sandbox, all succeed."""
    workspace = repository
    r = sandbox(["sh", "-c", IN_SANDBOX + """
        echo b > b; g add b; g commit -qm two
        g branch topic
        echo more >> b; g stash -q; g stash pop -q; g commit -qam three
        g checkout -q topic; echo t > t; g add t; g commit -qm topic; g rebase -q main
        g checkout -q main
        g worktree add -q wt2 -b wt2; cd wt2; echo w > w; g add w; g commit -qm in-wt2; cd ..
        cd wt; echo w > w; g add w; g commit -qm in-wt; cd ..
        cd nested; echo n > n; g add n; g commit -qm in-nested; cd ..
        cd sub; echo s > s; g add s; g commit -qm in-sub; cd ..
        echo done
    """], workspace)
    assert (r.exit_code, r.stdout) == (0, b"done\n"), r.stderr.decode()
    assert git(workspace, "log", "--format=%s", "main").split() == ["three", "two", "sub", "one"]
    assert git(workspace, "log", "--format=%s", "topic").split()[:2] == ["topic", "three"]
    for where, branch, subject in (("", "wt2", "in-wt2"), ("", "wt", "in-wt"),
                                   ("nested", "HEAD", "in-nested"), ("sub", "HEAD", "in-sub")):
        assert git(workspace / where, "log", "-1", "--format=%s", branch, "--").strip() == subject
    assert git(workspace, "stash", "list") == ""


ATTEMPTS = [
    "echo evil > .git/hooks/pre-commit", "echo evil > .git/hooks/post-checkout",
    "rm .git/hooks/pre-commit", "mv .git/hooks .git/hooks.old", "rm -r .git/hooks",
    "echo '[core] fsmonitor = evil' >> .git/config", "rm .git/config",
    "echo '[core] fsmonitor = evil' > /tmp/c && mv /tmp/c .git/config",
    "echo '[core] fsmonitor = evil' >> repo.gitconfig",  # an include in the work tree
    "echo '[core] fsmonitor = evil' >> .git/branch.inc",  # an includeIf in the gitdir
    "echo evil > nested/.git/hooks/pre-commit", "echo evil >> nested/.git/config",
    "echo evil > nested/tree-hooks/pre-commit",  # nested's core.hooksPath
    "echo /tmp > .git/worktrees/wt/commondir", "echo /tmp/x > .git/worktrees/wt/gitdir",
    "rm .git/worktrees/wt/commondir", "mv .git/worktrees/wt .git/worktrees/moved",
    "echo 'gitdir: /tmp' > wt/.git", "rm wt/.git", "mv wt/.git wt/git.old",
    "echo 'gitdir: /tmp' > sub/.git", "mv sub sub.old",
    "echo evil >> .git/modules/sub/config", "echo evil > .git/modules/sub/hooks/pre-commit",
    "mv .git/modules/sub .git/modules/other", "mv .git .git.old",
]


def attempt_each(workspace, attempts: list[str], **changes) -> dict[str, tuple[int, str]]:
    """Run each shell command in one sandbox, one after another: its status and output."""
    script = "".join(f'out=$( ( {command} ) 2>&1 ); echo "@{index} $? $out"\n'
                     for index, command in enumerate(attempts))
    r = sandbox(["sh", "-c", script], workspace, **changes)
    assert r.exit_code == 0, r.stderr
    outcomes = {}
    for chunk in re.split(r"(?m)^@", r.stdout.decode())[1:]:
        index, status, out = (chunk.rstrip("\n").split(" ", 2) + [""])[:3]
        outcomes[attempts[int(index)]] = (int(status), out)
    assert len(outcomes) == len(attempts), r.stdout
    return outcomes


def test_what_makes_git_run_code_or_use_another_gitdir_stays_read_only(repository):
    """Hooks, configuration and what it includes, a nested repository's, a submodule's, and
    every pointer to a gitdir or common dir: each write, removal and rename fails (read-only
    or a pinned mount point), while a new file in `.git` can be written."""
    workspace = repository
    before = snapshot(workspace)
    outcomes = attempt_each(workspace, [*ATTEMPTS, "echo fine > .git/made-by-the-command"])
    assert outcomes.pop("echo fine > .git/made-by-the-command")[0] == 0
    failed_otherwise = {command: outcome for command, outcome in outcomes.items()
                        if outcome[0] == 0 or not ("Read-only file system" in outcome[1]
                                                   or "Device or resource busy" in outcome[1])}
    assert failed_otherwise == {}
    after = snapshot(workspace)
    assert after.pop(".git/made-by-the-command")[2] == b"fine\n"
    assert after == before


def test_a_gitdir_without_hooks_gets_empty_read_only_ones(ws):
    """`git init --template=` makes no hooks directory, and with extensions.worktreeConfig on
    git reads a config.worktree that is not there: both are made empty at launch, as git would
    make them, so that neither can be created by the command."""
    workspace, _ = ws
    git(workspace, "init", "-q", "--template=")
    git(workspace, "config", "core.repositoryformatversion", "1")
    git(workspace, "config", "extensions.worktreeConfig", "true")
    assert not (workspace / ".git" / "hooks").exists()
    outcomes = attempt_each(workspace, ["echo evil > .git/hooks/pre-commit",
                                        "echo '[core] fsmonitor = evil' >> .git/config.worktree",
                                        "rmdir .git/hooks"])
    assert all(status != 0 for status, _ in outcomes.values()), outcomes
    assert os.listdir(workspace / ".git" / "hooks") == []
    assert (workspace / ".git" / "config.worktree").read_text() == ""


@pytest.mark.parametrize("case", ["include", "hooks-path", "gitdir", "linked-hooks", "link"])
def test_what_git_would_read_but_the_command_could_plant_is_refused(ws, case):
    """An include or a hooks directory in the work tree that does not exist, a `.git` file
    naming a gitdir that does not exist, `.git/hooks` or `.git` a symbolic link: the command
    could put its own there, so the launch is refused, naming the path; nothing is made."""
    workspace, outside = ws
    git(workspace, "init", "-q")
    named = {"include": workspace / "local.gitconfig", "hooks-path": workspace / ".husky",
             "gitdir": workspace / ".git" / "modules" / "gone",
             "linked-hooks": workspace / ".git" / "hooks", "link": workspace / ".git"}[case]
    if case == "include":
        git(workspace, "config", "include.path", "../local.gitconfig")
    elif case == "hooks-path":
        git(workspace, "config", "core.hooksPath", ".husky")
    elif case == "gitdir":
        (workspace / "sub").mkdir()
        (workspace / "sub" / ".git").write_text("gitdir: ../.git/modules/gone\n")
    elif case == "linked-hooks":
        shutil.rmtree(named)
        named.symlink_to(outside)
    else:
        shutil.move(workspace / ".git", outside / "repo.git")
        named.symlink_to(outside / "repo.git")
    before = snapshot(workspace), snapshot(outside)
    with pytest.raises(UnenforceableError) as refused:
        sandbox(["true"], workspace)
    assert refused.value.code == "unenforceable:filesystem.git"
    assert str(named) in refused.value.message
    assert (snapshot(workspace), snapshot(outside)) == before


def test_a_local_clones_objects_linked_to_another_repository_stay_read_only(ws):
    """`git clone` of a path hard-links the objects: writing one would change the repository
    outside every root. They are read-only (found by the walk through `.git`, as every file of
    a write root is), so their mode cannot be changed to write them, while commits, which
    write new objects, work."""
    workspace, outside = ws
    git(outside, "init", "-q", "upstream")
    (outside / "upstream" / "f").write_text("f\n")
    git(outside / "upstream", "add", "f")
    git(outside / "upstream", "commit", "-qm", "upstream")
    git(workspace, "clone", "-q", str(outside / "upstream"), "clone")
    clone = workspace / "clone"
    linked = [path for path in (clone / ".git" / "objects").rglob("*")
              if path.is_file() and path.stat().st_nlink > 1]
    assert linked, "git made no hard links here"
    before = snapshot(outside)
    targets = " ".join(str(path.relative_to(clone)) for path in linked)
    r = sandbox(["sh", "-c", f"for f in {targets}; do chmod u+w $f; echo evil >> $f; done; "
                 + IN_SANDBOX + "echo g > g; g add g; g commit -qm in-clone"], clone)
    assert snapshot(outside) == before
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.decode().splitlines()
    chmods = [line for line in lines if line.startswith("chmod: changing permissions")]
    writes = [line for line in lines if "cannot create .git/objects/" in line]
    assert len(chmods) == len(writes) == len(linked), lines
    assert all(line.endswith("Read-only file system") for line in chmods), chmods
    assert git(clone, "log", "-1", "--format=%s").strip() == "in-clone"


def test_git_read_only_keeps_all_of_git_as_it_was(repository):
    """`filesystem.git = "read-only"`: every `.git` and the gitdirs `.git` files name are
    read-only whole, so a commit fails, and nothing in them changes."""
    workspace = repository
    before = snapshot(workspace / ".git")
    r = sandbox(["sh", "-c", IN_SANDBOX + "g commit -q --allow-empty -m nope"], workspace,
                git="read-only")
    assert r.exit_code != 0 and b"index.lock" in r.stderr and b"Read-only" in r.stderr
    assert snapshot(workspace / ".git") == before


def test_git_writable_leaves_git_to_the_command(repository):
    """`filesystem.git = "writable"`: nothing of `.git` is protected (a hook can be written)."""
    workspace = repository
    r = sandbox(["sh", "-c", "echo '#!/bin/sh' > .git/hooks/post-commit"], workspace,
                git="writable")
    assert r.exit_code == 0, r.stderr
    assert (workspace / ".git" / "hooks" / "post-commit").read_text() == "#!/bin/sh\n"


def test_an_inherited_protected_name_can_be_removed(ws):
    """`protected = ["!.codex"]` over the preset: `.codex` is writable; `.agents` is not."""
    workspace, _ = ws
    for name in (".codex", ".agents"):
        (workspace / name).mkdir()
    policy = merge(policy_for(), {"filesystem": {"protected": ["!.codex"]}})
    assert ".codex" not in policy.filesystem.protected
    r = stockade.run(["sh", "-c", "echo ok > .codex/made; echo bad > .agents/made"], policy,
                     workspace=workspace)
    assert b"Read-only file system" in r.stderr
    assert (workspace / ".codex" / "made").read_text() == "ok\n"
    assert not (workspace / ".agents" / "made").exists()



def test_every_git_refusal_of_the_guard_names_filesystem_git_and_the_way_out(ws):
    """Issue 32: `git config`, `git remote add`, `git submodule add` and a second `git init`
    fail in the sandbox with git's own "Device or resource busy" alone (`submodule add` even
    exits 0). Each write the guard refused is now a `filesystem.git` violation naming the
    path, the git command to run on the host instead and the setting that allows it; the
    configuration is unchanged. With `git = "writable"` the same commands work and nothing
    is reported."""
    workspace, outside = ws
    git(outside, "init", "-q", "upstream")
    git(outside / "upstream", "commit", "-q", "--allow-empty", "-m", "upstream")
    for repository in ("guarded", "writable"):
        (workspace / repository).mkdir()
        git(workspace / repository, "init", "-q")
        git(workspace / repository, "commit", "-q", "--allow-empty", "-m", "one")
    config = (workspace / "guarded" / ".git" / "config").read_bytes()
    commands = ["git config user.name someone", "git remote add origin https://example.invalid",
                f"git -c protocol.file.allow=always submodule add -q {outside / 'upstream'} sub",
                "git init -q", "echo evil > .git/hooks/pre-commit"]
    for command in commands:
        r = sandbox(["sh", "-c", f"cd guarded && {command}"], workspace, read=(str(outside),))
        assert b"Device or resource busy" in r.stderr or b"Read-only" in r.stderr, r.stderr
        guard = [v.detail for v in r.violations if v.kind == "filesystem.git"]
        assert len(guard) == 1, (command, r.violations)
        assert str(workspace / "guarded" / ".git") in guard[0]
        assert f"git -C {workspace / 'guarded'} config" in guard[0], guard[0]
        assert 'filesystem.git = "writable"' in guard[0] and '"guarded"' in guard[0]
        assert (workspace / "guarded" / ".git" / "config").read_bytes() == config
    r = sandbox(["sh", "-c", "cd writable && " + " && ".join(commands)], workspace,
                read=(str(outside),), git="writable")
    assert r.exit_code == 0 and r.violations == (), r.stderr
    assert git(workspace / "writable", "remote", "get-url", "origin").strip() \
        == "https://example.invalid"
