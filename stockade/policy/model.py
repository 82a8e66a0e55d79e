"""The policy data model: what a parsed, validated policy document holds.

Paths here are still as written (placeholders such as `{workspace}` unexpanded, relative paths
relative to the workspace); `stockade.launch.compile` resolves them once, at compile time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

SCHEMA_VERSION = 1
NETWORK_MODES = ("none", "allowlist", "any")
# Unix socket files: "own" (those in a write root at launch are masked: the command's own
# work), "none" (no AF_UNIX socket can be made: socketpair only), "any" (every one reachable).
UNIX_SOCKET_MODES = ("own", "none", "any")
# The command's stdin: "null" (/dev/null) or "inherit" (the caller's stdin, relayed through a
# pipe by the owner, never the caller's descriptor itself). Unset, the caller chooses:
# the Python API reads nothing, `stockade run` relays a pipe or file but not a terminal.
STDIN_MODES = ("null", "inherit")
# What holds the sandbox: the host's native primitives, or a virtual machine (docs/vm.md).
CONTAINMENTS = ("native", "vm")
# How the Linux backend isolates a native sandbox: fresh namespaces and a mount view (the
# default), or, where namespaces cannot be made and only when asked, Landlock, seccomp and
# rlimits on the host's own view (stockade/linux/landlock_tier.py; it enforces less: see
# SECURITY.md).
ISOLATIONS = ("namespaces", "landlock")
# Names read-only whole at every nested occurrence in write roots (`filesystem.protected`):
# agents' own, and what makes a host tool run code later, found in a workspace or (the shell's
# and git's files) in a home directory used as one: MCP servers (`.mcp.json`), editor tasks
# and run configurations (`.vscode`, `.idea`, `.devcontainer`), agents' commands, sub-agents
# and hooks (`.claude`, `.cursor`, `.gemini`), submodule URLs and paths (`.gitmodules`),
# ripgrep's preprocessor (`.ripgreprc`), direnv (`.envrc`) and mise (`mise.toml`,
# `.mise.toml`: hooks and sourced env on `cd`), npm's and yarn's configuration (`.npmrc`:
# script-shell, node-options; `.yarnrc`, `.yarnrc.yml`: yarnPath, a program any yarn command
# there runs), pre-commit's hooks (`.pre-commit-config.yaml`: run by `git commit`), shell
# start-up files, git's configuration. Each is removed by "!NAME" in a policy.
AGENT_PROTECTED = (".agents", ".codex", ".stockade")
CODE_RUNNING_PROTECTED = (
    ".mcp.json", ".vscode", ".idea", ".devcontainer", ".claude", ".cursor", ".gemini",
    ".gitmodules", ".ripgreprc", ".envrc", "mise.toml", ".mise.toml", ".npmrc", ".yarnrc",
    ".yarnrc.yml", ".pre-commit-config.yaml",
    ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zshenv", ".zprofile",
    ".gitconfig",
)
DEFAULT_PROTECTED = tuple(sorted(AGENT_PROTECTED + CODE_RUNNING_PROTECTED))
# Below the home, besides its protected names: what makes a host program run code or change
# its behaviour at its next start: never applied from a change set (changeapply.py) and, with
# the home in a write root, read-only in the view and not made by the command (homecode.py). Git's
# second global configuration (core.fsmonitor, an alias); shells' start-up, logout, alias and
# completion files; autostart entries, user services, the session's environment; programs on
# the user's PATH (~/bin, ~/.local/bin, cargo's); every Python's user site-packages (a .pth
# runs in each); the configuration of pip, cargo, vim, neovim, emacs, tmux, readline, direnv,
# ipython, irb, psql, gdb, mercurial, wget, curl, npm init, less's filter, X sessions, mailcap
# and the desktop's choice of program (issue 29 A1: each shown to run code or fetch it). A
# deny-list stays incomplete: apply lands the rest of the home's hidden entries only when
# asked (changeapply.HomeConfig).
HOME_CODE = (
    ".config/git", ".config/fish", ".zlogin", ".zlogout", ".bash_logout", ".bash_aliases",
    ".bash_completion", ".local/share/bash-completion", ".config/autostart",
    ".config/systemd/user", ".config/environment.d", ".pam_environment", "bin", ".local/bin",
    ".local/lib", ".config/pip", ".pip", ".cargo/config", ".cargo/config.toml", ".cargo/bin",
    ".vimrc", ".exrc", ".vim", ".config/vim", ".config/nvim", ".local/share/nvim/site",
    ".emacs", ".emacs.el", ".emacs.d", ".config/emacs", ".tmux.conf", ".config/tmux",
    ".inputrc", ".config/direnv", ".ipython", ".irbrc", ".psqlrc", ".gdbinit", ".config/gdb",
    ".hgrc", ".config/hg", ".wgetrc", ".curlrc", ".npm-init.js", ".lessfilter", ".xprofile",
    ".xinitrc", ".xsession", ".xsessionrc", ".mailcap", ".config/mimeapps.list",
    ".local/share/applications",
)
# (what of HOME_CODE lies in $XDG_CONFIG_HOME when that is set elsewhere)
XDG_CODE = tuple(name.split("/", 1)[1] for name in HOME_CODE if name.startswith(".config/"))
# How `.git` is protected (`filesystem.git`): "guarded" (git works; what makes git run code or
# find another gitdir or config stays read-only: stockade/linux/gitdirs.py), "read-only" (all of
# every `.git` and the gitdirs `.git` files name), "writable" (not at all).
GIT_MODES = ("guarded", "read-only", "writable")
# The command's home directory (`filesystem.home`): "host" (HOME is the host's, writable only
# where a root says so), or "private" (HOME is a directory of the sandbox's own, one per
# workspace, kept between runs for caches and configuration; the host never reads it:
# stockade/launch/home.py).
HOME_MODES = ("host", "private")
# Where the command's writes to its write roots go (`filesystem.workspace`): "direct" (into
# them), or "overlay" (into an upper layer in Stockade's state directory, reviewed with
# `stockade changes` and applied or discarded after the run: stockade/lifecycle/changes.py).
WORKSPACE_MODES = ("direct", "overlay")


def protected_whole(names: Iterable[str], git: str, *, guards_git: bool) -> frozenset[str]:
    """The names a backend protects whole: `names`, and `.git` when `git` is "read-only" or,
    on a backend that cannot guard a repository (not `guards_git`), unless it is "writable":
    there "guarded" is enforced as "read-only", git can read but not commit."""
    whole = git == "read-only" or (not guards_git and git != "writable")
    return frozenset(names) | ({".git"} if whole else set())


@dataclass(frozen=True)
class FilesystemPolicy:
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    git: str = "guarded"
    home: str = "host"
    exec_from_write: bool = False
    workspace: str = "direct"


@dataclass(frozen=True)
class NetworkPolicy:
    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    reach: tuple[str, ...] = ()  # past the destination guard of mode "any"
    unix_sockets: str = "own"


@dataclass(frozen=True)
class EnvPolicy:
    passthrough: tuple[str, ...] = ()          # `env.pass` in the document
    set: tuple[tuple[str, str], ...] = ()      # sorted (name, value) pairs


@dataclass(frozen=True)
class Limits:
    timeout: float | None = None     # seconds, wall clock
    memory: int | None = None        # bytes
    cpu: float | None = None         # CPU rate, in cores
    pids: int | None = None          # processes and threads
    output: int | None = None        # captured bytes per stream
    file_size: int | None = None     # bytes, largest file the child may write


@dataclass(frozen=True)
class ProcessPolicy:
    cwd: str | None = None           # default: the workspace
    stdin: str | None = None         # None: the caller chooses (see STDIN_MODES)


@dataclass(frozen=True)
class Policy:
    version: int = SCHEMA_VERSION
    preset: str | None = None
    containment: str = "native"
    isolation: str = "namespaces"
    filesystem: FilesystemPolicy = field(default_factory=FilesystemPolicy)
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    env: EnvPolicy = field(default_factory=EnvPolicy)
    limits: Limits = field(default_factory=Limits)
    process: ProcessPolicy = field(default_factory=ProcessPolicy)
