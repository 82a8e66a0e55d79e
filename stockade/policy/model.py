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
# its behaviour at its next start: never applied from a change set (changeapply.py) and, in a
# write root, read-only in the view and not made by the command (homecode.py; with the home
# itself in a write root, every top-level hidden entry is, and of this list the rest). Git's
# second global configuration (core.fsmonitor, an alias); shells' start-up, logout, alias and
# completion files (bash's, zsh's, fish's, csh's and tcsh's, ksh's and mksh's, xonsh's,
# nushell's, and the directories start-up files source: oh-my-zsh, ~/.bashrc.d); autostart
# entries, user services and D-Bus services, the session's environment, window managers'
# and desktops' start-up and scripts; programs on the user's PATH (~/bin, ~/.local/bin,
# cargo's, Go's, bun's, deno's, pnpm's, yarn's, nix's profile) and the version managers whose
# shims or sourced scripts come first on it (pyenv, rbenv, nodenv, goenv, jenv, nvm, fnm,
# volta, sdkman, asdf, mise, rustup's toolchains and cargo's env script, opam); every
# Python's user site-packages (a .pth runs in each); the configuration of pip, uv, conda,
# cargo, gradle, maven, sbt, leiningen, gem, bundler, vim, neovim (and its plugins), emacs,
# VS Code (and its remote servers' extensions), tmux, screen, readline, less (lesskey's
# LESSOPEN), direnv, ipython, jupyter, pdb, irb, pry, R, julia, sqlite3, psql, gdb, mutt,
# mercurial, jujutsu, wget, curl, npm init, podman, pipewire, the prompt (starship),
# terminals that start the shell, X sessions, hotkey daemons, mailcap, Debian's
# sensible-editor and the desktop's choice of program (issue 29 A1, M1: each shown to run
# code or fetch it). A deny-list stays incomplete (issue 29 M3): apply lands the rest of the
# home's hidden entries only when asked (changeapply.HomeConfig), and the view keeps them all
# when the home is in a write root. `go` is whole: its module cache runs in host builds.
HOME_CODE = (
    ".config/git", ".config/fish", ".zlogin", ".zlogout", ".bash_logout", ".bash_aliases",
    ".bash_completion", ".local/share/bash-completion", ".config/autostart",
    ".config/systemd/user", ".config/environment.d", ".pam_environment", "bin", ".local/bin",
    ".local/lib", ".config/pip", ".pip", ".cargo/config", ".cargo/config.toml", ".cargo/bin",
    ".vimrc", ".exrc", ".vim", ".config/vim", ".config/nvim", ".local/share/nvim",
    ".emacs", ".emacs.el", ".emacs.d", ".config/emacs", ".tmux.conf", ".config/tmux",
    ".inputrc", ".config/direnv", ".ipython", ".irbrc", ".psqlrc", ".gdbinit", ".config/gdb",
    ".hgrc", ".config/hg", ".wgetrc", ".curlrc", ".npm-init.js", ".lessfilter", ".xprofile",
    ".xinitrc", ".xsession", ".xsessionrc", ".mailcap", ".config/mimeapps.list",
    ".local/share/applications",
    # (issue 29 M1) other shells' start-up files, and what start-up files source
    ".cshrc", ".tcshrc", ".login", ".logout", ".kshrc", ".mkshrc", ".xonshrc", ".config/xonsh",
    ".config/nushell", ".oh-my-zsh", ".bashrc.d", ".profile.d", ".config/starship.toml",
    # version managers, toolchains and what is on PATH
    ".pyenv", ".rbenv", ".nodenv", ".goenv", ".jenv", ".nvm", ".fnm", ".local/share/fnm",
    ".volta", ".sdkman", ".asdf", ".tool-versions", ".config/mise", ".local/share/mise",
    ".local/state/mise", ".rustup", ".cargo/env", ".cargo/env.fish", ".cargo/env.nu",
    ".opam", "go", ".bun/bin", ".deno/bin", ".local/share/pnpm", ".yarn/bin",
    ".nix-profile",
    # (attack 6) what interpreters load from the home by name: node's ~/node_modules for any
    # script below it, local::lib's perl5, R's user library, conda installs on PATH
    "node_modules", "perl5", "R", "miniconda3", "anaconda3", "miniforge3", "mambaforge",
    # tools' start-up files and configuration that names a program
    ".sqliterc", ".Rprofile", ".Renviron", ".julia/config", ".pryrc", ".pdbrc", ".jupyter",
    ".local/share/jupyter", ".config/irb", ".screenrc", ".config/screen", ".muttrc", ".mutt",
    ".config/mutt", ".lesskey", ".config/lesskey", ".tmux", ".spacemacs", ".doom.d",
    ".config/doom", ".direnvrc", ".selected_editor", ".config/jj", ".config/Code/User",
    ".config/VSCodium/User", ".config/Cursor/User", ".vscode-server", ".vscode-server-insiders",
    ".cursor-server", ".windsurf-server", ".config/kitty", ".config/alacritty",
    ".config/wezterm", ".wezterm.lua",
    # build tools and package managers: init scripts, and where they fetch from
    ".gradle/init.d", ".gradle/init.gradle", ".gradle/init.gradle.kts",
    ".gradle/gradle.properties", ".m2/settings.xml", ".mavenrc", ".sbt", ".lein", ".gemrc",
    ".bundle/config", ".config/uv", ".condarc", ".config/conda", ".pydistutils.cfg",
    ".config/containers",
    # the desktop: user units, D-Bus activation, sessions, window managers, scripts, sound
    ".local/share/systemd/user", ".local/share/dbus-1/services", ".config/dconf/user",
    ".config/i3", ".config/sway", ".config/hypr", ".config/openbox", ".config/awesome",
    ".config/bspwm", ".config/sxhkd", ".config/qtile", ".xmonad", ".config/xmonad",
    ".config/lxsession", ".config/plasma-workspace", ".config/autostart-scripts", ".Xclients",
    ".xbindkeysrc", ".local/share/nautilus/scripts", ".local/share/kio/servicemenus",
    ".local/share/kservices5", ".local/share/gnome-shell/extensions", ".local/share/plasma",
    ".config/pipewire", ".config/wireplumber",
)
# What of HOME_CODE lies in $XDG_CONFIG_HOME and $XDG_DATA_HOME when those are set elsewhere:
# each variable, and the names below it.
XDG_CODE = {
    variable: tuple(name[len(top):] for name in HOME_CODE if name.startswith(top))
    for variable, top in (("XDG_CONFIG_HOME", ".config/"), ("XDG_DATA_HOME", ".local/share/"))
}
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
class Credential:
    """`[[network.credentials]]`: a secret the proxy adds to requests to `host`, which the
    sandbox never holds (it sees `placeholder` text in variable `env`). Exactly one place
    (`header`, with `prefix`; `basic_user`, the secret as the password; `query`, a parameter)
    and one source on the host (`from_env`, a variable; `from_file`, a file, tidied)."""

    name: str
    host: str
    env: str
    header: str = ""
    prefix: str = ""
    basic_user: str = ""
    query: str = ""
    from_env: str = ""
    from_file: str = ""


@dataclass(frozen=True)
class HttpRule:
    """`[[network.http]]`: requests to `host` may use only `methods` (upper case; empty: any)
    on paths starting with one of `paths` (empty: any)."""

    host: str
    methods: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class NetworkPolicy:
    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    reach: tuple[str, ...] = ()  # past the destination guard of mode "any"
    unix_sockets: str = "own"
    credentials: tuple[Credential, ...] = ()
    http: tuple[HttpRule, ...] = ()


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
