"""The evidence matrix: one row per attack. Each names its program in attacks/, the arguments it
gets (placeholders filled from its scene, see setups.py), the preset and policy overrides it runs
under, the host-side setup, the mechanism that must refuse it (judges.py: data its judge
checks), the switches of the backend that make it fail when they are off (`proven`: the
mutation test, tests/test_evidence_mutations.py, checks exactly these) and where its positive
control runs (on the host, or in a sandbox with exactly its layer off). Every row is also
checked on the host: the outside tree unchanged, no secret in the child's output, no process
left over.

Layer names are the switches of frame.LAYERS, or "kernel" for a refusal that no switch of
Stockade's makes (a user namespace's own limits); a refusal code in capitals is what the attack
observed rather than an errno (attacks/_common.py).
"""

from __future__ import annotations

import os
from typing import Any

from stockade.evidence import casefold, launches, setups
from stockade.evidence.judges import (
    Bounded,
    Completed,
    Denied,
    EndedBy,
    Expect,
    Logged,
    OutputCut,
    ProxyRefused,
    Recorded,
    Refusal,
    RefusedBefore,
    refused_by,
)
from stockade.evidence.row import AS_ROOT, ROOTLESS, Condition, Mutation, Row, off, without
from stockade.policy.units import format_size

FORK_LIMIT = 64
MEMORY_LIMIT = 256 << 20
FILE_LIMIT = 1 << 20
OUTPUT_LIMIT = 64 << 10
SOAK_LAUNCHES = 64

by = refused_by


def denied(*refusals: Refusal) -> Denied:
    return Denied(refusals)


def row(id: str, category: str, attempt: str, attack: str, *args: str, expect: Expect,
        proven: tuple[Mutation, ...] | Mutation = (), setup: setups.Setup = setups.nothing,
        **options: Any) -> Row:
    proven_by = (proven,) if isinstance(proven, Mutation) else proven
    return Row(id, category, attempt, attack, expect, setup, args, proven_by=proven_by,
               **options)


def _fork_bound() -> int:
    """As root, RLIMIT_NPROC does not bind, and the sandbox's pid_max is the backstop."""
    from stockade.linux.limits import RESERVED_PIDS  # (POSIX-only: its rows run on Linux)

    return FORK_LIMIT + (RESERVED_PIDS if os.getuid() == 0 else 1)


def _limits(**limits: Any) -> dict[str, Any]:
    return {"limits": limits}


def knob(name: str, *values: str) -> Condition:
    return Condition(knob=name, values=values)


# What the view refuses: a path outside it does not exist (the mount view), or Landlock denies
# it; a write where the view has a read-only mount (the tmpfs root, a read root).
OUTSIDE = (by("mount_view", "ENOENT", "EROFS"), by("landlock", "EACCES"))
# Protected names and repositories: read-only re-mounts (EROFS), mount points (EBUSY).
PROTECTED = by("protected", "EROFS", "EBUSY")
READ_ONLY = (by("read_only", "EROFS"), by("landlock", "EACCES"))
# The code the host runs next: read-only re-mounts (EROFS), mount points (EBUSY).
HOST_CODE = by("host_code", "EROFS", "EBUSY")
HOST_CODE_REFUSED = "unenforceable:filesystem.host_code"
HOME_CODE_TARGETS = (
    "{home}/.config/git/config", "{home}/.config/git", "{home}/.local/bin",
    "{home}/.local/bin/tool", f"{{home}}/{setups.USER_SITE}/tool.pth",
    f"{{home}}/{setups.USER_SITE}/evil.pth", "{home}/.bash_aliases", "{home}/.cargo",
    "{home}/.config/systemd", "{home}/.config/autostart", "{home}/.less", "{home}/.node_modules",
    "{home}/go")
DENY = by("deny", "EACCES", "EBUSY", "EROFS")
VIEW_AND_LANDLOCK = off("mount_view", "landlock")
ANY = {"network": {"mode": "any"}}
STAND_INS = {"network": {"mode": "allowlist",
                         "allow": [f"{setups.REBIND_NAME}:{{scene:tcp4}}",
                                   setups.METADATA_NAME, "localhost:{scene:tcp4}"]}}
# The copy-on-write workspace: the write roots are overlays whose writes stay in a change set.
OVERLAY = {"filesystem": {"workspace": "overlay"}}
ALLOWLIST = {"network": {"mode": "allowlist", "allow": ["localhost", "evidence.test"]}}
GIT = "{ws}/a/b/.git"
# A protected name, and what of a repository stays read-only, two levels down (the rest of
# its .git is writable: git works).
NESTED_ATTEMPT = ("tamper with a protected .agents and a repository's config and hooks two "
                  "levels down in a write root")
NESTED_TARGETS = ("{ws}/a/b/.agents/rules", "{ws}/a/b/.agents", f"{GIT}/config", f"{GIT}/hooks",
                  f"{GIT}/hooks/pre-commit")
EXEC_DIRECTORIES = ("{ws}", "/tmp", "/dev/shm")
VM_UNPROVEN = "a guest's kernel is the layer: the Linux backend's switches do not reach it"
COMPILER = "the policy compiler refuses it before any backend runs: no switch reaches it"
SERVED = ("the CLI server's own backend makes a served run's sandbox: no switch of the row's "
          "reaches it (mutant cli-server-judges-its-own-host-code, tests/test_autoserver.py, "
          "proves it)")
BIND_NEEDS_ROOT = "a bind mount needs root (rootless users cannot make one)"
OVERLAY_NEEDS_ROOT = "an overlay mount needs root (rootless users cannot make one here)"
DEVICES = "only host root can open the host's devices: rootless there is nothing to keep away"


def _credential(host: str, name: str = "evidence", env: str = "EVIDENCE_TOKEN",
                **source: str) -> dict[str, str]:
    """A `[[network.credentials]]` entry: the secret as a bearer token, from the scene's
    file unless `source` says otherwise."""
    return {"name": name, "host": host, "env": env, "header": "Authorization",
            "prefix": "Bearer ", **(source or {"from_file": "{scene:token_file}"})}


# The hosts of setups.credential_hosts: the credential's (HTTPS, GET and HEAD under /repos/org/
# only) and another (HTTPS and plain HTTP, GET and POST under /ok/ only: HTTP rules name it, so
# the proxy reads it). Names under it are allowed too (a placeholder in one must be refused
# for what it carries), and loopback literally (where the stand-in DNS sends them all).
API = f"{setups.API_NAME}:{{scene:api}}"
READ_HOSTS = {"network": {
    "mode": "allowlist",
    "allow": [API, *(f"{prefix}{setups.OTHER_NAME}:{{scene:{port}}}" for prefix in ("", "*.")
                     for port in ("other_tls", "other_plain")),
              *(f"127.0.0.1:{{scene:{port}}}" for port in ("api", "other_tls", "other_plain"))],
    "credentials": [_credential(API)],
    "http": [{"host": API, "methods": ["GET", "HEAD"], "paths": ["/repos/org/"]},
             {"host": setups.OTHER_NAME, "methods": ["GET", "POST"], "paths": ["/ok/"]}]}}
API_AT, PLAIN_AT, TLS_AT = (f"{setups.API_NAME}:{{api}}", f"{setups.OTHER_NAME}:{{other_plain}}",
                            f"{setups.OTHER_NAME}:{{other_tls}}")
EXFILTRATION = ProxyRefused((by("proxy_credentials", "HTTP_403"),),
                            reasons=("credential_exfiltration",))
# A credential's host that resolves to the metadata address, allowed; another, and a name no
# credential has, which resolve to loopback, in no allow list: the approval function allows them.
GUARDED = {"network": {"mode": "allowlist", "allow": [f"{setups.METADATA_NAME}:80"],
                       "credentials": [_credential(f"{setups.METADATA_NAME}:80"),
                                       _credential(f"{setups.REBIND_NAME}:{{scene:web}}",
                                                   "approved", "EVIDENCE_APPROVED_TOKEN")]}}
# Two credentials: one from the caller's environment, one from a credential store of the home
# (denied by the presets) in a root the sandbox reads.
SECRETS = {"filesystem": {"read": ["{home}"]}, "network": {
    "mode": "allowlist", "allow": [f"{setups.API_NAME}:443"],
    "credentials": [_credential(f"{setups.API_NAME}:443", "from-env",
                                from_env=setups.SECRET_SOURCE),
                    _credential(f"{setups.OTHER_NAME}:443", "from-file", "EVIDENCE_FILE_TOKEN",
                                from_file="{home}/.git-credentials")]}}
CA_KEY = {"network": {"mode": "allowlist", "allow": [f"{setups.API_NAME}:443"],
                      "credentials": [_credential(f"{setups.API_NAME}:443")]}}
APPROVED = {"network": {"mode": "allowlist", "allow": ["127.0.0.1:{scene:web}"]}}

ROWS: tuple[Row, ...] = (
    # --- filesystem ------------------------------------------------------------------------
    row("fs.read-outside", "filesystem", "read a file and list directories outside every root",
        "read_paths.py", "{secret_file}", "{outside}/", "{host_directory}",
        expect=denied(*OUTSIDE), proven=VIEW_AND_LANDLOCK, setup=setups.host_directory),
    row("fs.write-outside", "filesystem",
        "create, overwrite, truncate, rename and delete outside every root, also via ws/..",
        "tamper.py", "{secret_file}", "{outside}/new", "{outside}", "{ws}/../outside/new",
        expect=denied(*OUTSIDE), proven=VIEW_AND_LANDLOCK),
    row("fs.write-read-root", "filesystem",
        "modify a read-only root (read-only preset): write, truncate, rename, delete",
        "tamper.py", "{ws}/file", "{ws}/dir", "{ws}/new", expect=denied(*READ_ONLY),
        proven=off("read_only", "landlock"), preset="read-only", setup=setups.workspace_files),
    row("fs.protected-dir", "filesystem", NESTED_ATTEMPT, "tamper.py", *NESTED_TARGETS,
        expect=denied(PROTECTED), proven=off("protected"), setup=setups.nested_repository),
    row("fs.protected-code-running", "filesystem",
        "tamper with files a host tool runs code from later (.mcp.json, .vscode, .claude "
        "commands, .gitmodules, .envrc, .bashrc, ...) two levels down in a write root",
        "tamper.py", *(f"{{ws}}/a/b/{rel}" for rel in setups.CODE_RUNNING),
        "{ws}/a/b/.vscode", "{ws}/a/b/.claude/commands", expect=denied(PROTECTED),
        proven=off("protected"), setup=setups.code_running_files),
    row("fs.host-code", "filesystem",
        "plant a .pth file, change a module, move aside a directory on the host's import path "
        "(code the next host call runs) two levels down in a write root",
        "tamper.py", "{ws}/a/lib/site", "{ws}/a/lib/site/mod.py", "{ws}/a/lib/site/evil.pth",
        expect=denied(HOST_CODE), proven=off("host_code"), setup=setups.host_code_in_workspace),
    row("fs.host-code-rename", "filesystem",
        "rename each directory above a directory on the host's import path, then plant a "
        "replacement", "fs_rename.py", "{ws}", "{ws}/a/lib/site", expect=denied(HOST_CODE),
        proven=(off("host_code"), off("pins")), setup=setups.host_code_in_workspace),
    row("fs.host-code-pth-missing", "filesystem",
        "make the missing directory a .pth file of the host's site-packages names in a write "
        "root, with a stockade package the host's next `python -m stockade` imports first",
        "host_code_plant.py", "{ws}/src", expect=RefusedBefore(HOST_CODE_REFUSED),
        unproven=COMPILER, setup=setups.pth_names_missing_directory,
        launch=launches.compiled_in_the_venv),
    row("fs.host-code-other-name", "filesystem",
        "write a json.py and change a module in a directory on the host's import path, outside "
        "the write root, that a bind mount shows in it under another name",
        "tamper.py", "{ws}/pp/json.py", "{ws}/pp/mod.py", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.host_code_bound_in_workspace,
        root_only=BIND_NEEDS_ROOT),
    row("fs.host-code-overlay-upper", "filesystem",
        "write a json.py in the upper layer, in the write root, of an overlay that is a "
        "directory on the host's import path", "tamper.py", "{ws}/up/json.py",
        expect=RefusedBefore(HOST_CODE_REFUSED), unproven=COMPILER,
        setup=setups.host_code_on_overlay_of_workspace_upper, root_only=OVERLAY_NEEDS_ROOT),
    row("fs.host-code-mount-below", "filesystem",
        "change a workspace file bound onto a sitecustomize.py in a directory on the host's "
        "import path, outside the write root", "tamper.py", "{ws}/sc.py",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.workspace_file_bound_onto_host_code, root_only=BIND_NEEDS_ROOT),
    row("fs.host-code-linked-entry", "filesystem",
        "change a workspace file a sitecustomize.py in a directory on the host's import path, "
        "outside the write root, is a symbolic link to", "tamper.py", "{ws}/sc.py",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.host_code_linked_to_workspace),
    row("fs.host-code-imported-module", "filesystem",
        "change a workspace package the host's program imported by a finder of its own (an "
        "editable install's), started in a directory above the workspace",
        "tamper.py", "{ws}/pkg/__init__.py", expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.workspace_package_imported, launch=launches.compiled_after_importing),
    row("fs.host-code-pycache-prefix", "filesystem",
        "forge a .pyc in the host's bytecode cache prefix (PYTHONPYCACHEPREFIX), a directory "
        "in the write root: the cache of a module the host imports, and a new file there",
        "tamper.py", "{pyc}", "{prefix}", expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.pycache_prefix_in_workspace),
    row("fs.host-code-editable-mapping", "filesystem",
        "change a workspace package an editable install's finder (setuptools', on the host "
        "program's sys.meta_path) maps its name to, not imported yet",
        "tamper.py", "{ws}/pkg/__init__.py", "{ws}/pkg", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.workspace_package_mapped,
        launch=launches.compiled_beside_a_finder),
    row("fs.host-code-start-link", "filesystem",
        "change a workspace package the host's program imported through a symbolic link to it "
        "in its starting directory (first on its import path), outside the write root",
        "tamper.py", "{ws}/pkg/__init__.py", "{ws}/pkg", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.workspace_package_linked_from_start,
        launch=launches.compiled_started_through_a_link),
    row("fs.host-code-shadowing-name", "filesystem",
        "make, beside a workspace module file the host's program imported by a finder of its "
        "own, the names its next import takes first: a package directory of its name, an "
        "extension module, the missing __pycache__ (mkdir, open, symlink, rename)",
        "host_code_shadow.py", "{ws}/lib/mod", "{ws}/lib/mod{ext}", "{ws}/lib/__pycache__",
        expect=Recorded((by("names_watch", "EACCES"),), kind="filesystem.host_code"),
        proven=(off("host_code"), off("names_watch")), setup=setups.workspace_module_imported,
        launch=launches.compiled_after_importing),
    row("fs.host-code-prefix-part", "filesystem",
        "replace the interpreter, and plant a script, in the bin directory of the venv the "
        "host's program runs from, outside the write root, that a bind mount shows in it",
        "tamper.py", "{ws}/vbin/python", "{ws}/vbin/stockade", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.venv_bin_bound_in_workspace,
        launch=launches.compiled_in_the_venv, root_only=BIND_NEEDS_ROOT),
    row("fs.host-code-relative-entry", "filesystem",
        "plant a json.py in, and rewrite a zip file that is, a relative entry on the import "
        "path of the host's program (\"src\", \"overrides.zip\"), which runs in the workspace",
        "tamper.py", "{ws}/src/json.py", "{ws}/src", "{ws}/overrides.zip",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.relative_entries_in_workspace,
        launch=launches.compiled_with_relative_entries),
    row("fs.host-code-searched", "filesystem",
        "plant a module in a workspace directory the host's program (started beside the "
        "workspace) searched for an import and took off its import path again, and make the "
        "missing one it searched likewise (mkdir, open, symlink, rename)",
        "host_code_shadow.py", "{ws}/lib/colorsys.py", "{ws}/plugins",
        expect=Recorded((HOST_CODE, by("names_watch", "EACCES")), kind="filesystem.host_code"),
        proven=(off("host_code"), off("names_watch")),
        setup=setups.workspace_directories_searched, launch=launches.compiled_after_searching),
    row("fs.host-code-working-directory", "filesystem",
        "plant a csv.py in the workspace directory the host's program (started with -c beside "
        "the workspace, \"\" first on its import path) moved into after importing Stockade",
        "tamper.py", "{ws}/sub/csv.py", "{ws}/sub", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.working_directory_in_workspace,
        launch=launches.compiled_after_moving_in),
    row("fs.host-code-searched-below-start", "filesystem",
        "plant a module in a workspace directory the host's program (started in the directory "
        "holding the workspace) searched for an optional import and took off its import path "
        "again", "tamper.py", "{ws}/plugins/site_plugins.py", "{ws}/plugins",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.workspace_directory_searched_below_start,
        launch=launches.compiled_after_searching_below_start),
    row("fs.host-code-package-path", "filesystem",
        "plant a plugin in a workspace directory a package of the host's program (outside the "
        "workspace) was given on its __path__ besides its own, as a plugin loader does",
        "tamper.py", "{ws}/.app/plugins/evil.py", "{ws}/.app/plugins",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.package_path_extended_into_workspace,
        launch=launches.compiled_after_extending_a_package),
    row("fs.host-code-namespace-portion", "filesystem",
        "plant a plugin in a workspace directory a namespace package of the host's program "
        "(outside the workspace) was given on its __path__, and make the missing one a package "
        "it made from a spec with no origin was given (mkdir, open, symlink, rename)",
        "host_code_shadow.py", "{ws}/.app/plugins/evil.py", "{ws}/.app/extensions",
        expect=Recorded((HOST_CODE, by("names_watch", "EACCES")), kind="filesystem.host_code"),
        proven=(off("host_code"), off("names_watch")),
        setup=setups.package_paths_given_without_an_origin,
        launch=launches.compiled_after_giving_originless_packages),
    row("fs.host-code-module-as-package", "filesystem",
        "plant a plugin in the workspace directory of a module file the host's program loaded "
        "as a package (spec_from_file_location with submodule_search_locations), its __path__",
        "tamper.py", "{ws}/.app/evil.py", "{ws}/.app", expect=denied(HOST_CODE),
        proven=off("host_code"), setup=setups.module_loaded_as_a_package,
        launch=launches.compiled_after_loading_a_module_as_a_package),
    row("fs.host-code-runtime-site-pth", "filesystem",
        "make the missing directory a .pth file names in a site directory the host's program "
        "added at run time (site.addsitedir, as activate_this.py does), in a write root",
        "host_code_plant.py", "{ws}/src", expect=RefusedBefore(HOST_CODE_REFUSED),
        unproven=COMPILER, setup=setups.site_directory_added_names_missing_directory,
        launch=launches.compiled_after_adding_a_site_directory),
    row("fs.host-code-finder-held-path", "filesystem",
        "plant a plugin in each workspace directory an import finder of the host's program "
        "(a plugin loader's, outside the workspace) holds: as a str, a pathlib.Path in a table "
        "or a list, in a set, as a table's key, in a __slots__ slot, and held by a path-entry "
        "finder a hook of its own made",
        "tamper.py", *(f"{{held}}/{shape}" for shape in setups.HELD_SHAPES),
        expect=denied(HOST_CODE), proven=off("host_code"), setup=setups.directories_finders_hold,
        launch=launches.compiled_beside_holding_finders),
    row("fs.host-code-relative-next-run", "filesystem",
        "make the missing relative entry \"plugins\" on the import path of the host's "
        "program, which a path hook of its own takes (mkdir, open, symlink, rename), and plant "
        "a module in the relative entry \"tools\", each resolved from the workspace, where the "
        "program started, though it moved out before the run",
        "host_code_shadow.py", "{ws}/plugins", "{ws}/tools/tools_extra.py",
        expect=Recorded((HOST_CODE, by("names_watch", "EACCES")), kind="filesystem.host_code"),
        proven=(off("host_code"), off("names_watch")),
        setup=setups.relative_entries_of_a_program_moved_out,
        launch=launches.compiled_after_moving_out),
    row("fs.host-code-dot-dot-link", "filesystem",
        "make the missing workspace directory a package of the host's program, imported "
        "through a link to it outside the workspace, put on its __path__ as \"<its "
        "directory>/../mypkg_plugins\", which the kernel resolves after the link into the "
        "workspace (mkdir, open, symlink, rename)",
        "host_code_shadow.py", "{ws}/src/mypkg_plugins",
        expect=Recorded((by("names_watch", "EACCES"),), kind="filesystem.host_code"),
        proven=(off("host_code"), off("names_watch")),
        setup=setups.package_linked_with_dot_dot_path,
        launch=launches.compiled_after_importing_through_a_link),
    row("fs.host-code-module-origin", "filesystem",
        "rewrite the workspace modules the host's program (started beside the workspace) "
        "loaded: one by a relative path, and a plugin whose spec carries its path only as its "
        "origin (no __file__)", "tamper.py", "{ws}/hooks/agent_hooks.py", "{plugin}",
        expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.modules_loaded_by_relative_path_and_origin,
        launch=launches.compiled_after_loading_by_origin),
    row("fs.host-code-below-moved-cwd", "filesystem",
        "rewrite a workspace plugin the host's program (started with -c beside the workspace, "
        "\"\" first on its import path) loaded after moving into the directory holding the "
        "workspace", "tamper.py", "{plugin}", expect=denied(HOST_CODE), proven=off("host_code"),
        setup=setups.plugin_below_a_working_directory,
        launch=launches.compiled_after_moving_above),
    row("fs.home-code", "filesystem",
        "with the home as the workspace: write, move or make the home's hidden entries, "
        "every one, and its code (git's configuration, ~/.local/bin, a .pth in the user "
        "site-packages; missing: .bash_aliases, ~/.cargo, ~/.config/systemd, "
        "~/.config/autostart, ~/.less, ~/.node_modules, ~/go)",
        "tamper.py", *HOME_CODE_TARGETS, expect=denied(HOST_CODE, by("names_watch", "EACCES")),
        proven=(off("host_code"), off("names_watch")), setup=setups.home_code,
        launch=launches.in_the_home),
    row("fs.private-home-other", "filesystem",
        "with the home as the workspace (a rootless user's private homes lie in it, beside "
        "the seal key's directory, whatever state directory the run names): plant a "
        "git configuration in another workspace's private home, make one for a workspace "
        "not yet run, move them aside",
        "tamper.py", "{other_home}/.config/git/config", "{other_home}/.config/git",
        "{other_home}", "{homes}", expect=denied(by("stockade_state", "ENOENT", "EROFS", "EBUSY")),
        proven=off("stockade_state"), setup=setups.other_private_home,
        launch=launches.in_the_home),
    row("fs.protected-create", "filesystem",
        "make protected names (.codex, .mcp.json, .envrc, .claude, .bashrc, .gemini, "
        ".vscode) at run time in a write root and two levels down: mkdir, open with O_CREAT "
        "(also through a dangling symlink), mknod, symlink, link, rename",
        "fs_protected_create.py", "{ws}", "{ws}/a/b", expect=denied(by("names_watch", "EACCES")),
        proven=off("names_watch"), setup=setups.protected_create_places),
    row("fs.protected-file", "filesystem",
        "tamper with a .git file (worktree pointer) and the config and hooks of the gitdir it "
        "points to", "tamper.py", "{ws}/sub/.git", "{ws}/.repo-git/config",
        "{ws}/.repo-git/hooks", expect=denied(PROTECTED), proven=off("protected"),
        setup=setups.git_file),
    row("fs.protected-rename", "filesystem",
        "rename a repository's hooks or config or any directory above them, then plant a "
        "replacement", "fs_rename.py", "{ws}", f"{GIT}/hooks", f"{GIT}/config",
        expect=denied(PROTECTED), proven=(off("protected"), off("pins")),
        setup=setups.nested_repository),
    row("fs.git-pointers", "filesystem",
        "tamper with what leads git to other configuration: a file the config includes, a "
        "linked worktree's .git file, commondir and gitdir, a submodule's .git file, config "
        "and hooks", "tamper.py",
        "{ws}/shared.gitconfig", "{ws}/wt/.git", "{ws}/.git/worktrees/wt/commondir",
        "{ws}/.git/worktrees/wt/gitdir", "{ws}/sub/.git", "{ws}/.git/modules/sub/config",
        "{ws}/.git/modules/sub/hooks", expect=denied(PROTECTED), proven=off("protected"),
        setup=setups.git_pointers),
    row("fs.protected-bind-alias", "filesystem",
        "tamper with a repository's hooks and a .vscode directory at the second path a bind "
        "mount shows each at in the write root", "tamper.py", "{ws}/sub/hooks/pre-commit",
        "{ws}/sub/editor/tasks.json", expect=denied(PROTECTED), proven=off("protected"),
        setup=setups.protected_bound_in_workspace, root_only=BIND_NEEDS_ROOT),
    row("fs.metadata", "filesystem",
        "change the mode and times of files outside every root, in a read-only root, and of "
        "protected names and a repository's config and hooks in a write root",
        "fs_metadata.py", "{secret_file}", "{outside}", "{root}/ro/file", "{ws}/a/b/.agents",
        f"{GIT}/config", f"{GIT}/hooks",
        expect=denied(by("mount_view", "ENOENT"), by("read_only", "EROFS"), PROTECTED),
        proven=(off("mount_view"), off("read_only"), off("protected")),
        setup=setups.metadata_targets),
    row("fs.watch-outside", "filesystem",
        "watch a directory and a file outside every root for the host's activity there "
        "(inotify)", "fs_watch.py", "{outside}", "{secret_file}",
        expect=denied(by("mount_view", "ENOENT")), proven=off("mount_view")),
    row("fs.git-absent", "filesystem",
        "create the file a repository's config includes, absent at launch, in the work tree",
        "tamper.py", "{ws}/local.gitconfig",
        expect=RefusedBefore("unenforceable:filesystem.git"), proven=off("protected"),
        setup=setups.git_include_absent),
    row("fs.deny-in-root", "filesystem",
        "read, list, write, rename and delete denied paths inside a granted write root",
        "tamper.py", "--read", "{ws}/keys/id", "{ws}/keys", "{ws}/token",
        expect=denied(DENY), proven=off("deny"), setup=setups.denied_paths,
        policy={"filesystem": {"deny": ["{workspace}/keys", "{workspace}/token"]}}),
    row("fs.deny-hard-link", "filesystem",
        "read a denied file under another name: a hard link the host made elsewhere in the "
        "write root before the launch (and the denied path itself)", "read_paths.py",
        "{ws}/backup/id.bak", "{ws}/keys/id",
        expect=denied(by("deny_links", "EACCES"), DENY), proven=off("deny_links"),
        setup=setups.denied_file_linked, policy={"filesystem": {"deny": ["{workspace}/keys/id"]}}),
    row("fs.deny-hard-link-read-root", "filesystem",
        "read a denied file through a hard link the host made in a read root, which the launch "
        "looks through for it", "read_paths.py", "{root}/ro/id.bak",
        expect=RefusedBefore("unenforceable:filesystem.deny"), proven=off("deny_links"),
        setup=setups.denied_file_linked_in_read_root,
        policy={"filesystem": {"deny": ["{workspace}/keys/id"]}}),
    row("fs.deny-hard-link-overlay-layer", "filesystem",
        "read a denied file through an overlay in a read root whose lower layer, a directory "
        "outside every root, holds a hard link of it the host made (the overlay's directories "
        "on a device of its own)", "read_paths.py", "{root}/ro/m/id",
        expect=RefusedBefore("unenforceable:filesystem.deny"), proven=off("deny_links"),
        setup=setups.denied_file_linked_in_overlay_layer, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{workspace}/keys/id"]}}),
    row("fs.deny-link-unlisted", "filesystem",
        "read a denied file through a hard link the host made in the write root, the denied "
        "directory enterable but not listable (0311), so its files cannot be looked for there",
        "read_paths.py", "{ws}/backup/id.bak", "{ws}/keys/id",
        expect=denied(by("deny_links", "EACCES"), DENY), proven=off("deny_links"),
        setup=setups.denied_dir_unlisted, policy={"filesystem": {"deny": ["{workspace}/keys"]}}),
    row("fs.deny-link-bind-alias", "filesystem",
        "read a denied file through a hard link in the write root at the second path a bind "
        "mount of its directory into a read root gives it, which no walk of the write root meets",
        "read_paths.py", "{root}/ro/view/id.bak", "{ws}/backup/id.bak",
        expect=denied(by("deny_links", "EACCES"), DENY), proven=off("deny_links"),
        setup=setups.denied_link_bound_into_read_root, root_only=BIND_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{workspace}/keys/id"]}}),
    row("fs.mask-rename", "filesystem",
        "rename denied paths inside a write root or any directory above them, then plant a "
        "replacement (the mask would move with its parent, the secret be in the clear at the "
        "new path for the next run)", "fs_rename.py", "{ws}", "{ws}/a/b/token", "{ws}/c/d/keys",
        expect=denied(by("pins", "EBUSY"), DENY), proven=off("pins"),
        setup=setups.denied_below_directories,
        policy={"filesystem": {"deny": ["{workspace}/a/b/token", "{workspace}/c/d/keys"]}}),
    row("fs.symlink-planted", "filesystem",
        "follow links planted before launch: absolute, relative, to a directory, through ..",
        "fs_symlink.py", "follow", "{ws}/abs-link", "{ws}/rel-link", "{ws}/dir-link/secret",
        "{ws}/dotdot-link", expect=denied(*OUTSIDE), proven=VIEW_AND_LANDLOCK,
        setup=setups.planted_symlinks),
    row("fs.symlink-runtime", "filesystem",
        "create absolute, relative and ..-chain links to outside paths at run time, follow them",
        "fs_symlink.py", "create", "{secret_file}", "{outside}", expect=denied(*OUTSIDE),
        proven=VIEW_AND_LANDLOCK),
    row("fs.hardlink", "filesystem",
        "write through a planted hard link to an outside file; link outside and read-only files",
        "fs_hardlink.py", "{ws}/hard", "{secret_file}", "{root}/ro/file",
        expect=denied(PROTECTED, by("mount_view", "ENOENT", "EXDEV"), by("landlock", "EACCES")),
        proven=off("protected"), setup=setups.planted_hard_link),
    row("fs.proc-root", "filesystem",
        "reach outside files through /proc/self/root, the sandbox's init's root and cwd, and a "
        "host pid's root, cwd, environ and memory",
        "fs_proc_root.py", "{secret_file}", "{host_pid}",
        expect=denied(by("pid_namespace", "ENOENT"), *OUTSIDE), proven=VIEW_AND_LANDLOCK),
    row("fs.exec-from-write", "filesystem",
        "run a program copied into the workspace, /tmp and /dev/shm",
        "fs_exec.py", "direct", *EXEC_DIRECTORIES,
        expect=denied(by("noexec", "EACCES"), by("landlock", "EACCES"),
                      by("exec_watch", "EACCES")),
        proven=off("noexec", "landlock", "exec_watch"), preset="workspace-write-no-exec",
        control=without("noexec", "landlock", "exec_watch")),
    row("fs.exec-via-loader", "filesystem",
        "run a program copied into the workspace, /tmp and /dev/shm through ld.so",
        "fs_exec.py", "loader", *EXEC_DIRECTORIES,
        expect=denied(by("exec_watch", "LOADER_MAP_REFUSED"), by("noexec", "LOADER_MAP_REFUSED")),
        proven=off("noexec", "exec_watch"), preset="workspace-write-no-exec",
        control=without("noexec", "exec_watch")),
    row("fs.exec-via-mmap", "filesystem",
        "map a program copied into the workspace, /tmp and /dev/shm executable (mmap "
        "PROT_EXEC, mprotect PROT_EXEC)", "fs_exec.py", "mmap", *EXEC_DIRECTORIES,
        expect=denied(by("exec_watch", "EACCES"), by("noexec", "EPERM")),
        proven=off("noexec", "exec_watch"), preset="workspace-write-no-exec",
        control=without("noexec", "exec_watch")),
    row("fs.mknod", "filesystem", "create character and block device nodes", "fs_mknod.py",
        "{ws}", "/tmp", expect=denied(by("landlock", "EACCES"), by("kernel", "EPERM")),
        setup=setups.empty_workspace,
        unproven="no user namespace may make device nodes: the kernel refuses them whatever "
                 "Stockade's layers", root_only="only host root can make device nodes"),
    row("fs.block-device", "filesystem", "open the host's block devices and common disk names",
        "open_devices.py", "*{devices}",
        expect=denied(by("mount_view", "ENOENT"), by("landlock", "EACCES")),
        proven=off("mount_view"), root_only=DEVICES,
        setup=setups.host_devices("/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/loop0",
                                  block=True)),
    row("fs.proc-fd-reopen", "filesystem",
        "reopen a read-only descriptor writable via /proc/self/fd and /dev/fd",
        "fs_proc_fd.py", "{ws}/file", expect=denied(*READ_ONLY),
        proven=off("read_only", "landlock"), preset="read-only", setup=setups.read_only_file),
    row("fs.truncate-read-only", "filesystem",
        "truncate a read-only file by path and by O_TRUNC", "fs_truncate.py",
        "{ws}/file", expect=denied(*READ_ONLY),
        proven=off("read_only", "landlock"), preset="read-only", setup=setups.read_only_file),
    row("fs.case-alias", "filesystem",
        "on a case-folding filesystem, reach protected and denied names by other spellings",
        "fs_case_alias.py", "{ws}/.git", "{ws}/.GIT/config", "{ws}/.git/CONFIG",
        "{ws}/.Git/HOOKS/pre-commit", "{ws}/sub/.GIT", "{ws}/KEYS/id", "{ws}/TOKEN",
        "{ws}/other/.git/config",
        expect=RefusedBefore("unenforceable:filesystem.case_alias"),
        proven=off("protected", "deny"), setup=setups.case_folding_workspace,
        policy={"filesystem": {"deny": ["{workspace}/keys", "{workspace}/token"]}},
        launch=casefold.launch, control=without("protected", "deny")),
    row("fs.memfd-exec", "filesystem",
        "execute a program written into a memfd: fexecve, and by its /proc/self/fd path",
        "fs_memfd.py", expect=denied(by("memfd_noexec", "EACCES"), by("memfd_seal", "EACCES"),
                                     by("exec_watch", "EACCES")),
        proven=off("memfd_noexec", "memfd_seal", "exec_watch"),
        preset="workspace-write-no-exec"),
    row("fs.privilege-bits", "filesystem",
        "make a copy of sh setuid or setgid in a write root (chmod, fchmod, fchmodat, open, "
        "mknod), as root give it a file capability", "fs_privilege.py", "{ws}", "{host_user}",
        expect=denied(by("seccomp", "EPERM")), proven=off("seccomp"),
        setup=setups.privilege_bits, control=without("seccomp", "privileges")),
    row("fs.deny-whole-tree", "filesystem",
        "with the whole host tree as a read root (read = [\"/\"]): SSH keys, cloud, git, "
        "registry and cluster credentials in the home directory", "read_paths.py",
        "{home}/.ssh/", *(f"{{home}}/{name}" for name in setups.HOME_SECRETS),
        expect=denied(DENY), proven=off("deny"), setup=setups.fake_home,
        policy={"filesystem": {"read": ["/"]}}),
    row("fs.deny-passwd-home", "filesystem",
        "with HOME naming another directory than the password database's home (sudo -E, a CI "
        "runner): read the credential stores of the password database's home, a read root",
        "read_paths.py", "{passwd_home}/.ssh/",
        *(f"{{passwd_home}}/{name}" for name in setups.HOME_SECRETS), expect=denied(DENY),
        proven=off("deny"), preset="read-only", setup=setups.passwd_home,
        policy={"filesystem": {"read": ["{scene:passwd_home}"]}}),
    row("fs.deny-bind-alias", "filesystem",
        "read denied paths by the names bind mounts give them: the vault that holds them bound "
        "at a second path (a read root), a denied key bound on a file of the workspace",
        "read_paths.py", "{alias}/keys/id", "{alias}/keys/", "{alias}/token", "{ws}/bound",
        expect=denied(DENY), proven=off("deny"), setup=setups.bound_vault,
        root_only=BIND_NEEDS_ROOT,
        policy={"filesystem": {"read": ["{scene:alias}"],
                               "deny": ["{scene:vault}/keys", "{scene:vault}/token"]}}),
    row("fs.mount-of-removed-name", "filesystem",
        "read a denied file through a bind mount in a read root of a hard link of it, the link "
        "removed since (the mount table names the mount by the removed path, //deleted)",
        "read_paths.py", "{root}/ro/view.bak",
        expect=RefusedBefore("unenforceable:filesystem.read"), unproven=COMPILER,
        setup=setups.removed_link_bound_into_read_root, root_only=BIND_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{workspace}/keys/id"]}}),
    row("fs.mount-unlookable", "filesystem",
        "read a denied directory bound at a path longer than PATH_MAX in a read root, a "
        "directory at a time (the mount table lists it; no lookup of its point reaches it)",
        "read_deep.py", "{root}/ro", "{deep_name}", "{deep_levels}", "id",
        expect=RefusedBefore("unenforceable:filesystem.read"), unproven=COMPILER,
        setup=setups.deep_vault_in_read_root, root_only=BIND_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-of-denied", "filesystem",
        "read a denied directory's files through an overlay in a read root whose lower layer "
        "it is (on a device of the overlay's own, where no name is compared with the denied "
        "ones)", "read_paths.py", "{root}/ro/m/id", "{root}/ro/m/",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.overlaid_vault_in_read_root, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-unjudged", "filesystem",
        "read a denied directory's files through an overlay above a read root whose lower "
        "layer the mount table gives relative (as a container engine writes its layers)",
        "read_paths.py", "{root}/m/sub/id", "{root}/m/sub/",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.overlay_above_read_root, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-layer-copy", "filesystem",
        "read a denied path that lies on an overlay where its lower layer, which a read root "
        "holds, keeps it under the layer's own name", "read_paths.py", "{root}/ro/lower/vault/id",
        "{root}/ro/lower/vault/", expect=RefusedBefore("unenforceable:filesystem.deny"),
        unproven=COMPILER, setup=setups.overlay_of_read_root_layer, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:overlaid}"]}}),
    row("fs.overlay-shared-layer", "filesystem",
        "read a denied path that lies on an overlay whose lower layer another overlay in a read "
        "root has too, under another name (a bind mount of the layer)", "read_paths.py",
        "{root}/ro/view/vault/id", "{root}/ro/view/vault/",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.overlay_of_shared_layer, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:overlaid}"]}}),
    row("fs.overlay-covered-layer", "filesystem",
        "read a denied directory's files through an overlay in a read root mounted over a bind "
        "of it, the overlay's lower layer its own point (which then names the overlay)",
        "read_paths.py", "{root}/ro/v/id", "{root}/ro/v/",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.overlay_covering_bound_vault, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-hidden-layer", "filesystem",
        "read a denied directory's files through an overlay in a read root whose lower layer "
        "is a bind of it below the overlay's own point (a name the overlay hides)",
        "read_paths.py", "{root}/ro/v/id", "{root}/ro/v/",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.overlay_hiding_bound_vault, root_only=OVERLAY_NEEDS_ROOT,
        policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-state-upper", "filesystem",
        "plant a socket in Stockade's state directory, which lies on an overlay whose upper "
        "layer an overlay in the write root has too, under another name (a bind mount)",
        "tamper.py", "{ws}/view/state/cli.sock",
        expect=RefusedBefore("unenforceable:filesystem.deny"), unproven=COMPILER,
        setup=setups.state_on_overlay_of_shared_upper, root_only=OVERLAY_NEEDS_ROOT),
    row("fs.overlay-bind-below-denied", "filesystem",
        "read a denied directory's files through an overlay in a read root whose lower layer "
        "is a bind mount of a directory inside it", "read_paths.py", "{root}/ro/m/id",
        "{root}/ro/m/", expect=RefusedBefore("unenforceable:filesystem.deny"),
        unproven=COMPILER, setup=setups.overlay_of_bound_vault_part,
        root_only=OVERLAY_NEEDS_ROOT, policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.overlay-proc-layer", "filesystem",
        "read a denied directory's files through an overlay in a read root whose lower layer "
        "its mounter named by its own descriptor on it (/proc/self/fd/N)", "read_paths.py",
        "{root}/ro/m/id", "{root}/ro/m/", expect=RefusedBefore("unenforceable:filesystem.deny"),
        unproven=COMPILER, setup=setups.overlay_of_proc_named_vault,
        root_only=OVERLAY_NEEDS_ROOT, policy={"filesystem": {"deny": ["{scene:vault}"]}}),
    row("fs.deny-absent", "filesystem",
        "create a denied path that does not exist at launch inside the write root (~/.aws)",
        "tamper.py", "{ws}/.aws", expect=RefusedBefore("unenforceable:filesystem.deny"),
        unproven=COMPILER, policy={"filesystem": {"deny": ["{workspace}/.aws"]}}),
    row("fs.planted-root-link", "filesystem",
        "a grant redirected by a link an earlier run planted (ws/build -> outside, --write build)",
        "tamper.py", "{ws}/build/escaped",
        expect=RefusedBefore("unenforceable:filesystem.symlink"), unproven=COMPILER,
        setup=setups.planted_root_link,
        policy={"filesystem": {"write": ["{workspace}", "{workspace}/build"]}}),
    row("fs.deny-repointable", "filesystem",
        "read a denied directory by the path a symbolic link in the write root (the denied "
        "path) points to, the link the command could point elsewhere for the next launch to "
        "deny instead", "read_paths.py", "{ws}/b/real/id", "{ws}/a/secret/id",
        expect=RefusedBefore("unenforceable:filesystem.symlink"), unproven=COMPILER,
        setup=setups.denied_through_link,
        policy={"filesystem": {"deny": ["{workspace}/a/secret"]}}),
    # --- filesystem: the copy-on-write workspace (filesystem.workspace = "overlay") ---------
    row("fs.overlay-writes", "filesystem",
        "in an overlaid workspace: overwrite, append to, truncate, rename, delete and chmod "
        "files, remove a directory, create files and links (each must work in the sandbox)",
        "fs_overlay.py", "{ws}",
        expect=Completed("changed", "the host's workspace unchanged (every write in the "
                                    "overlay's upper layer)"),
        proven=off("overlay"), setup=setups.overlay_workspace, policy=OVERLAY,
        control=without("overlay")),
    row("fs.overlay-protected", "filesystem", "in an overlaid workspace: " + NESTED_ATTEMPT,
        "tamper.py", *NESTED_TARGETS, expect=denied(PROTECTED), proven=off("protected"),
        setup=setups.nested_repository, policy=OVERLAY),
    row("fs.overlay-deny", "filesystem",
        "in an overlaid workspace: read, list, write, rename and delete denied paths",
        "tamper.py", "--read", "{ws}/keys/id", "{ws}/keys", "{ws}/token",
        expect=denied(DENY), proven=off("deny"), setup=setups.denied_paths,
        policy={"filesystem": {"workspace": "overlay",
                               "deny": ["{workspace}/keys", "{workspace}/token"]}}),
    row("fs.overlay-exec", "filesystem",
        "in an overlaid workspace: run a program copied into it", "fs_exec.py", "direct",
        "{ws}", expect=denied(by("noexec", "EACCES"), by("landlock", "EACCES"),
                              by("exec_watch", "EACCES")),
        proven=off("noexec", "landlock", "exec_watch"), preset="workspace-write-no-exec",
        policy=OVERLAY, control=without("noexec", "landlock", "exec_watch")),
    row("fs.overlay-exec-via-loader", "filesystem",
        "in an overlaid workspace: run a program copied into it through ld.so", "fs_exec.py",
        "loader", "{ws}",
        expect=denied(by("exec_watch", "LOADER_MAP_REFUSED"), by("noexec", "LOADER_MAP_REFUSED")),
        proven=off("noexec", "exec_watch"), preset="workspace-write-no-exec", policy=OVERLAY,
        control=without("noexec", "exec_watch")),
    row("fs.overlay-exec-via-mmap", "filesystem",
        "in an overlaid workspace: map a program copied into it executable (mmap PROT_EXEC, "
        "mprotect PROT_EXEC)", "fs_exec.py", "mmap", "{ws}",
        expect=denied(by("exec_watch", "EACCES"), by("noexec", "EPERM")),
        proven=off("noexec", "exec_watch"), preset="workspace-write-no-exec", policy=OVERLAY,
        control=without("noexec", "exec_watch")),
    row("fs.overlay-review", "filesystem",
        "in an overlaid workspace: plant a script whose line a CR and an escape sequence erase "
        "on screen, a name that hides itself the same way and a fifo, for the owner's review",
        "fs_review.py", "{ws}", expect=denied(by("review_escape", "ESCAPED")),
        proven=off("review_escape"), setup=setups.overlay_review, policy=OVERLAY,
        launch=launches.reviewed, control=without("review_escape")),
    row("fs.approval-write-outside", "filesystem",
        "with every destination approved while it runs (an approval function that allows "
        "all, asked about a host no allow list names, which it then reaches): write and "
        "delete files outside every root", "net_credentials.py", "approved",
        f"{setups.APPROVED_NAME}:{{web}}", "{outside}/new", "{secret_file}",
        "{ws}/../outside/new2", expect=denied(*OUTSIDE), proven=VIEW_AND_LANDLOCK,
        setup=setups.approved_host, policy=APPROVED, launch=launches.approved,
        control=without("mount_view", "landlock")),
    # --- network ---------------------------------------------------------------------------
    row("net.tcp-loopback", "network", "TCP to a server on the host's loopback (IPv4, IPv6)",
        "net_connect.py", "tcp:127.0.0.1:{tcp4}", "tcp:[::1]:{tcp6}",
        expect=denied(by("network", "ECONNREFUSED", "ENETUNREACH"), by("landlock", "EACCES")),
        proven=off("network", "landlock"), setup=setups.loopback_tcp),
    row("net.udp-loopback", "network", "UDP to a server on the host's loopback (IPv4, IPv6)",
        "net_connect.py", "udp:127.0.0.1:{udp4}", "udp:[::1]:{udp6}",
        expect=denied(by("network", "ECONNREFUSED", "ENETUNREACH", "NO_REPLY")),
        proven=off("network"), setup=setups.loopback_udp),
    row("net.dns-loopback", "network", "DNS queries (UDP and TCP) to a resolver on host loopback",
        "net_connect.py", "dns-udp:127.0.0.1:{dns_udp}", "dns-tcp:127.0.0.1:{dns_tcp}",
        expect=denied(by("network", "ECONNREFUSED", "ENETUNREACH", "NO_REPLY"),
                      by("landlock", "EACCES")),
        proven=off("network"), setup=setups.loopback_dns),
    row("net.test-host", "network", "TCP, UDP and DNS to a test host outside the sandbox",
        "net_connect.py", "tcp:{test_host}:{test_tcp}", "dns-tcp:{test_host}:{test_tcp}",
        "udp:{test_host}:{test_udp}", "dns-udp:{test_host}:{test_udp}",
        expect=denied(by("network", "ENETUNREACH", "NO_REPLY"), by("landlock", "EACCES")),
        proven=off("network"), setup=setups.test_host),
    row("net.listen", "network", "listen on a TCP port and wait for the host to connect",
        "net_listen.py", "{listen_port}", "1.5", expect=denied(by("landlock", "EACCES")),
        proven=off("landlock"), setup=setups.host_prober),
    row("net.unix-abstract", "network", "connect to an abstract unix socket of the host",
        "net_unix.py", "abstract:{abstract}",
        expect=denied(by("network", "ECONNREFUSED"), by("landlock", "EPERM")),
        proven=off("network", "landlock"), setup=setups.abstract_socket),
    row("net.unix-path", "network", "connect to a unix socket file of the host outside the roots",
        "net_unix.py", "{outside}/host.sock", expect=denied(*OUTSIDE),
        proven=off("mount_view"), setup=setups.path_socket),
    row("net.inherited-socket", "network",
        "use a connected socket the launching process left inheritable (the launcher forks "
        "the sandbox itself)", "net_inherited.py", "{leaked_fd}",
        expect=denied(by("descriptors", "NO_SOCKET", "EBADF")), proven=off("descriptors"),
        setup=setups.inherited_socket, launch=launches.with_an_inheritable_socket),
    row("net.allowlist-direct", "network", "allowlist mode: connect directly, ignoring the proxy",
        "net_proxy.py", "direct:127.0.0.1:{tcp4}",
        expect=denied(by("network", "ECONNREFUSED", "ENETUNREACH"), by("landlock", "EACCES")),
        proven=off("network", "landlock"), setup=setups.loopback_tcp, policy=ALLOWLIST),
    row("net.allowlist-rebind", "network",
        "allowlist mode: CONNECT via the proxy to an allowed name and port whose DNS answers "
        "loopback", "net_proxy.py", f"via:{setups.REBIND_NAME}:{{tcp4}}",
        expect=ProxyRefused((by("proxy_addresses", "HTTP_403"),), reasons=("address_loopback",)),
        proven=off("proxy_addresses"), setup=setups.stand_in_network, policy=STAND_INS,
        launch=launches.through_stand_ins, control=without("proxy_addresses")),
    row("net.allowlist-ip-literal", "network",
        "allowlist mode: CONNECT via the proxy to an IP literal not in the list",
        "net_proxy.py", "via:127.0.0.1:{tcp4}",
        expect=ProxyRefused((by("proxy_rules", "HTTP_403"),), reasons=("not_allowed",)),
        proven=off("proxy_rules", "proxy_addresses"), setup=setups.stand_in_network,
        policy=STAND_INS, launch=launches.through_stand_ins,
        control=without("proxy_rules", "proxy_addresses")),
    row("net.allowlist-metadata", "network",
        "allowlist mode: CONNECT via the proxy to an allowed name whose DNS answers the cloud "
        "metadata address", "net_proxy.py", f"via:{setups.METADATA_NAME}:80",
        expect=ProxyRefused((by("proxy_addresses", "HTTP_403"),), reasons=("address_metadata",)),
        proven=off("proxy_addresses"), setup=setups.stand_in_network, policy=STAND_INS,
        launch=launches.through_stand_ins, control=without("proxy_addresses")),
    row("net.any-loopback", "network",
        "network any: TCP to servers on the host's loopback (IPv4, IPv6)", "net_connect.py",
        "tcp:127.0.0.1:{tcp4}", "tcp:[::1]:{tcp6}",
        expect=denied(by("usernet_isolation", "ECONNREFUSED")),
        proven=(off("usernet_isolation"), off("network")), setup=setups.loopback_tcp,
        policy=ANY),
    row("net.any-guarded", "network",
        "network any: TCP, UDP and DNS to a test host at a guarded address (as root in a "
        "namespace of its own on 198.18/15 and a random ULA /64; rootless the host's own "
        "addresses), and its other IPv6 forms: IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4 "
        "(2002::/16, these two as root), and the host's link-local address with its interface "
        "as scope (IPv6 where this host has an IPv6 default route)",
        "net_connect.py", "tcp:{test_host}:{test_tcp}", "udp:{test_host}:{test_udp}",
        "dns-udp:{test_host}:{test_udp}", "*{test_ipv6}",
        # (the guard's answer to a link-local address reaches no socket bound to the link,
        # which times out: its denial must be in the guard's log)
        expect=Logged((by("address_guard", "EHOSTUNREACH", "EPERM", "EACCES"),
                       by("address_guard", "TimeoutError", attempts="tcp [fe80"),
                       by("network", "ECONNREFUSED", "NO_REPLY")), silent=("TimeoutError",)),
        proven=(off("address_guard", when=AS_ROOT), off("network")), setup=setups.test_host6,
        policy=ANY),
    row("net.any-inbound", "network",
        "network any: send one UDP datagram from a port of the sandbox's choice, learn the "
        "host port it left from, and be reached there by senders never contacted (another "
        "machine, the host's loopback and own address)", "net_inbound.py", "{peer}",
        "{peer_port}", "{chosen}", "4",
        expect=denied(by("source_ports", "REMAPPED", attempts="take host UDP port"),
                      by("inbound_guard", "NO_DATAGRAM", attempts="receive")),
        proven=(off("inbound_guard"), off("source_ports")), setup=setups.knocking_peer,
        policy={"network": {"mode": "any", "reach": ["{scene:peer}"]}},
        control=without("inbound_guard", "source_ports"),
        root_only="rootless there is no other machine on this host for the sandbox to contact "
                  "(the host's addresses are its own too); tests/test_network_any_inbound.py "
                  "shows it rootless in a small internet of its own"),
    row("net.address-families", "network",
        "create AF_VSOCK (reaches the hypervisor from any namespace), AF_ALG, AF_PACKET, "
        "Bluetooth and AF_KEY sockets (created only, never connected)", "net_family.py",
        "*{families}", expect=denied(by("seccomp", "EAFNOSUPPORT")), proven=off("seccomp"),
        setup=setups.host_families("AF_VSOCK=40:1", "AF_ALG=38:5", "AF_PACKET=17:2",
                                   "AF_BLUETOOTH=31:1", "AF_KEY=15:3")),
    row("net.unix-in-write-root", "network",
        "connect to a unix socket a host server listens on inside the write root",
        "net_unix.py", "{ws}/host.sock",
        expect=denied(by("unix_sockets", "ECONNREFUSED", "EACCES")), proven=off("unix_sockets"),
        setup=setups.socket_in_workspace),
    row("net.unix-in-read-root", "network",
        "connect to a unix socket a host server listens on inside a read root",
        "net_unix.py", "{outside}/host.sock",
        expect=denied(by("unix_sockets", "ECONNREFUSED", "EACCES")), proven=off("unix_sockets"),
        setup=setups.path_socket, policy={"filesystem": {"read": ["{scene:outside}"]}}),
    row("net.credential-elsewhere", "network",
        "send a credential's placeholder to another host the proxy reads, over plain HTTP and "
        "intercepted HTTPS: in a header, in the query, in a body", "net_credentials.py",
        "elsewhere", PLAIN_AT, TLS_AT, expect=EXFILTRATION, proven=off("proxy_credentials"),
        setup=setups.credential_hosts(), policy=READ_HOSTS, launch=launches.through_stand_ins,
        control=without("proxy_credentials")),
    row("net.credential-hidden", "network",
        "hide the placeholder: in a redirect of the credential's host to another that the "
        "client follows with its headers, in a host name (CONNECT, plain HTTP: it would reach "
        "DNS), in a body split between two writes, and between two chunks",
        "net_credentials.py", "hidden", API_AT, PLAIN_AT, TLS_AT, expect=EXFILTRATION,
        proven=off("proxy_credentials"), setup=setups.credential_hosts("api"),
        policy=READ_HOSTS, launch=launches.through_stand_ins,
        control=without("proxy_credentials")),
    row("net.credential-ca-key", "network",
        "seek the launch CA's private key: beside its certificate, in the files of the view, "
        "in its own descriptors and every /proc/<pid> it sees; read the memory, environment "
        "and descriptors of the process that runs the proxy, which holds it",
        "net_credentials.py", "ca-key", "{host_pid}", "{home}", "{ws}",
        expect=denied(by("pid_namespace", "ENOENT", "ESRCH")),
        unproven="the key is in no file, only in the memory of the process that runs the "
                 "proxy, outside the sandbox's user namespace, whose processes the kernel's "
                 "ptrace check keeps from it whatever Stockade's switches (mutant "
                 "ca-key-beside-its-certificate, tests/test_evidence_network.py, shows the "
                 "search finds a key in a file)",
        setup=setups.credential_file, policy=CA_KEY),
    row("net.http-framing", "network",
        "smuggle: requests whose end two parsers read differently (Content-Length beside "
        "Transfer-Encoding, two lengths, a coding before chunked), over intercepted HTTPS and "
        "plain HTTP", "net_credentials.py", "framing", API_AT, PLAIN_AT,
        expect=ProxyRefused((by("proxy_framing", "HTTP_400"),), reasons=("ambiguous_framing",)),
        proven=off("proxy_framing"), setup=setups.credential_hosts(), policy=READ_HOSTS,
        launch=launches.through_stand_ins, control=without("proxy_framing")),
    row("net.http-rules", "network",
        "methods and paths network.http does not allow (DELETE, POST, another prefix, dot "
        "segments, an encoded slash), over intercepted HTTPS and plain HTTP",
        "net_credentials.py", "rules", API_AT, PLAIN_AT,
        expect=ProxyRefused((by("proxy_http", "HTTP_403"),), reasons=(
            "method_not_allowed", "path_not_allowed", "path_ambiguous")),
        proven=off("proxy_http"), setup=setups.credential_hosts(), policy=READ_HOSTS,
        launch=launches.through_stand_ins, control=without("proxy_http")),
    row("net.credential-guarded", "network",
        "reach a guarded address through names a credential or the caller's approval (a "
        "function that allows all) lets through: CONNECT to a credential's host whose DNS "
        "answers the metadata address, and to an approved credential's host, and plain HTTP "
        "to an approved name, whose DNS answers loopback", "net_credentials.py", "guarded",
        f"connect:{setups.METADATA_NAME}:80", f"connect:{setups.REBIND_NAME}:{{web}}",
        f"get:{setups.APPROVED_NAME}:{{web}}",
        expect=ProxyRefused((by("proxy_addresses", "HTTP_403"),),
                            reasons=("address_loopback", "address_metadata")),
        proven=off("proxy_addresses"), setup=setups.guarded_hosts, policy=GUARDED,
        launch=launches.approved, control=without("proxy_addresses")),
    # --- process ---------------------------------------------------------------------------
    row("proc.ptrace", "process",
        "ptrace and process_vm_readv: the sandbox's init, a host process, an own child",
        "proc_ptrace.py", "{victim}", "{victim_tag}",
        expect=denied(by("seccomp", "EPERM"), by("pid_namespace", "ESRCH")),
        proven=off("seccomp"), setup=setups.victim),
    row("proc.pid1-descriptors", "process",
        "have the sandbox's pid 1 open its own descriptors (status pipe, lifeline) and maps "
        "for the command: an O_CREAT open it makes from inside /proc/1 (the working "
        "directory, a descriptor, /proc/1/task/1, a magic link leading there)",
        "proc_pid1_fds.py", expect=denied(by("proc_guard", "EACCES")), proven=off("proc_guard"),
        control=without("proc_guard")),
    row("proc.host-visible", "process",
        "see a host process: read its command line and status, list its descriptors, take a "
        "pidfd on it", "proc_visible.py", "{victim}", "{victim_tag}",
        expect=denied(by("pid_namespace", "ENOENT", "ESRCH")), proven=off("pid_namespace"),
        setup=setups.victim),
    row("proc.signal-host", "process", "signal a host process by pid and process group",
        "proc_signal.py", "{victim}", "{victim_tag}",
        expect=denied(by("pid_namespace", "ESRCH"), by("landlock", "EPERM")),
        proven=off("pid_namespace", "landlock"), setup=setups.victim),
    row("proc.control-host", "process",
        "take control of a host process by pid: lower its limits (a 1 s CPU limit), renice it, "
        "pin it to one CPU, make it SCHED_IDLE, give it the idle I/O class", "proc_control.py",
        "{victim}", "{victim_tag}", expect=denied(by("pid_namespace", "ESRCH")),
        proven=off("pid_namespace"), setup=setups.victim),
    row("proc.tty-injection", "process",
        "TIOCSTI/TIOCLINUX on an own pty and on the host's terminal as stdin, made controlling",
        "proc_tty.py", expect=denied(by("seccomp", "EPERM"), by("kernel", "ENXIO", "EIO")),
        proven=off("seccomp", when=knob("dev/tty/legacy_tiocsti", "1")),
        unproven="with dev.tty.legacy_tiocsti = 0 the kernel refuses TIOCSTI itself",
        setup=setups.host_terminal, control=without("seccomp")),
    row("proc.caller-terminal", "process",
        "run from a host terminal (stdin, stdout, stderr): find it, change its settings, read "
        "what is typed on it, open /dev/tty", "proc_stdio.py",
        expect=denied(by("stdio_relay", "ENOTTY", "EBADF", "ENXIO", "NO_TERMINAL",
                         "NOTHING_READ")),
        proven=off("stdio_relay"), setup=setups.caller_terminal,
        launch=launches.from_the_callers_streams),
    row("proc.setuid", "process", "run a set-user-id program owned by another user",
        "proc_setuid.py", "{setuid}", "{setuid_arg}",
        expect=denied(by("nosuid", "UID_KEPT"), by("privileges", "UID_KEPT")),
        unproven="its owner has no uid in the sandbox's user namespace: the kernel ignores the "
                 "bit whatever the mounts and no_new_privs",
        setup=setups.setuid_program),
    row("proc.capabilities", "process",
        "use capabilities (sethostname, raw socket); run without no_new_privs",
        "proc_capabilities.py", "{host_user}",
        expect=denied(by("privileges", "EPERM", "NONE_HELD", "SET"),
                      by("seccomp", "EAFNOSUPPORT")),
        # (rootless, Landlock sets no_new_privs itself: it needs it without CAP_SYS_ADMIN)
        proven=(off("privileges", when=AS_ROOT), off("privileges", "landlock", when=ROOTLESS)),
        control=without("privileges", "seccomp", "landlock")),
    row("proc.user-namespace", "process",
        "create namespaces: unshare and clone with CLONE_NEWUSER, setns", "proc_syscall.py",
        "namespaces", expect=denied(by("seccomp", "EPERM")), proven=off("seccomp")),
    row("proc.mount", "process",
        "mount, bind-mount, umount, new mount API, pivot_root, chroot", "proc_syscall.py",
        "mount", "{ws}/mnt", expect=denied(by("seccomp", "EPERM"), by("privileges", "EPERM")),
        proven=off("privileges", "seccomp"),
        root_only="rootless, the command has no capability in its user namespace: a mount "
                  "fails whatever the layers",
        setup=setups.mount_point, control=without("privileges", "seccomp", "landlock")),
    row("proc.clone3", "process", "clone3 with CLONE_NEWUSER, and plain", "proc_syscall.py",
        "clone3", expect=denied(by("seccomp", "ENOSYS")), proven=off("seccomp")),
    row("proc.keyctl", "process", "kernel keyrings: add_key, keyctl", "proc_syscall.py",
        "keyctl", expect=denied(by("seccomp", "EPERM")), proven=off("seccomp")),
    row("proc.bpf", "process", "bpf: create a map, load a socket filter", "proc_syscall.py",
        "bpf", expect=denied(by("seccomp", "EPERM"), by("kernel", "EPERM")),
        unproven="bpf needs CAP_BPF of the host's user namespace: the kernel refuses it to "
                 "every sandbox whatever Stockade's layers",
        root_only="the kernel refuses bpf to users (kernel.unprivileged_bpf_disabled)"),
    row("proc.perf-event", "process", "perf_event_open on itself (allowed at paranoid 2)",
        "proc_syscall.py", "perf_event_open", expect=denied(by("seccomp", "EPERM")),
        proven=off("seccomp", when=knob("kernel/perf_event_paranoid", "-1", "0", "1", "2")),
        unproven="above paranoid 2 the kernel refuses it itself"),
    row("proc.userfaultfd", "process", "userfaultfd (user-mode only) and /dev/userfaultfd",
        "proc_syscall.py", "userfaultfd",
        expect=denied(by("seccomp", "EPERM"), by("mount_view", "ENOENT")),
        proven=off("seccomp")),
    row("proc.io-uring", "process", "io_uring_setup", "proc_syscall.py", "io_uring",
        expect=denied(by("seccomp", "EPERM")),
        proven=off("seccomp", when=knob("kernel/io_uring_disabled", "", "0")),
        unproven="with kernel.io_uring_disabled set the kernel refuses it itself"),
    row("proc.dev-mem", "process", "open /dev/mem, /dev/kmem, /dev/port, /dev/kmsg",
        "open_devices.py", "*{devices}",
        expect=denied(by("mount_view", "ENOENT"), by("landlock", "EACCES"),
                      by("kernel", "EPERM")),
        proven=off("mount_view", "landlock"), root_only=DEVICES,
        setup=setups.host_devices("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg")),
    # --- environment -----------------------------------------------------------------------
    row("env.parent-secrets", "environment",
        "find the parent's secret variables in the environment and in /proc/*/environ",
        "env_secrets.py", *setups.SECRET_VARIABLES, expect=denied(by("environment", "ABSENT")),
        proven=off("environment"), setup=setups.parent_secrets, launch=launches.from_a_caller),
    row("env.loader-variables", "environment",
        "inherit LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, PYTHONSTARTUP, BASH_ENV from the parent",
        "env_secrets.py", *setups.LOADER_VARIABLES, expect=denied(by("environment", "ABSENT")),
        proven=off("environment"), setup=setups.loader_injection,
        launch=launches.from_a_caller),
    row("env.refused-loader", "environment", "a policy that sets LD_PRELOAD for the child",
        "env_secrets.py", "LD_PRELOAD", expect=RefusedBefore("env_refused"),
        unproven=COMPILER,
        policy={"env": {"set": {"LD_PRELOAD": "/tmp/libevil.so"}}}),
    row("env.refused-credential", "environment",
        "a policy that passes the parent's GITHUB_TOKEN to the child", "env_secrets.py",
        "GITHUB_TOKEN", expect=RefusedBefore("env_refused"),
        unproven=COMPILER,
        setup=setups.credential_in_environment,
        policy={"env": {"pass": ["PATH", "GITHUB_TOKEN"]}}),
    row("env.home", "environment", "read the home directory, SSH keys and shell history",
        "read_paths.py", "{home}/", "{home}/.ssh/id_ed25519", "{home}/.bash_history",
        "{home}/.aws/credentials", expect=denied(*OUTSIDE), proven=VIEW_AND_LANDLOCK,
        setup=setups.fake_home),
    row("env.home-credentials", "environment",
        "with home granted read: SSH keys, cloud, git, registry and cluster credentials",
        "read_paths.py", "{home}/.ssh/", *(f"{{home}}/{name}" for name in setups.HOME_SECRETS),
        expect=denied(DENY), proven=off("deny"), setup=setups.fake_home,
        policy={"filesystem": {"read": ["{home}"]}}),
    row("env.credential-secret", "environment",
        "find the real secrets of two credentials (one from the launching process's "
        "environment, one from a credential store of the home it may read): in its "
        "environment, every /proc/<pid>/environ and cmdline, the files of its view",
        "net_credentials.py", "secret", "{probes}", "{home}", "{ws}",
        expect=denied(by("deny", "ABSENT")), proven=off("deny"),
        setup=setups.credential_secrets, policy=SECRETS, launch=launches.from_a_caller,
        control=without("deny")),
    # --- resources -------------------------------------------------------------------------
    row("res.fork-bomb", "resources", f"fork without end (pids = {FORK_LIMIT})",
        "res_fork.py", "600",
        expect=Bounded((by("rlimits", "EAGAIN"), by("pid_max", "EAGAIN")), note="processes",
                       limit=_fork_bound),
        proven=(off("rlimits", when=ROOTLESS), off("pid_max", when=AS_ROOT)),
        setup=setups.heartbeat(), policy=_limits(pids=FORK_LIMIT, timeout="30s"),
        control=without("rlimits", "pid_max")),
    row("res.memory-bomb", "resources",
        f"allocate without end (memory = {MEMORY_LIMIT >> 20} MiB)", "res_memory.py",
        str(4 * MEMORY_LIMIT),
        expect=Bounded((by("rlimits", "ENOMEM"),), note="allocated MiB",
                       limit=lambda: MEMORY_LIMIT >> 20, unit=" MiB"),
        proven=off("rlimits"), setup=setups.heartbeat(),
        policy=_limits(memory=format_size(MEMORY_LIMIT)), control=without("rlimits")),
    row("res.disk-fill", "resources",
        f"fill files in the workspace and /tmp (file_size = {FILE_LIMIT >> 20} MiB)",
        "res_disk.py", str(8 * FILE_LIMIT), "{fill}", "/tmp/fill",
        expect=denied(by("rlimits", "EFBIG")), proven=off("rlimits"),
        setup=setups.heartbeat(setups.fill_target(FILE_LIMIT)),
        policy=_limits(file_size=format_size(FILE_LIMIT)), control=without("rlimits")),
    row("res.cpu-spin", "resources", "spin every core past the timeout (1.5 s)", "res_spin.sh",
        expect=EndedBy("limits.timeout", 5.0), proven=off("timeout"), setup=setups.heartbeat(),
        policy=_limits(timeout="1500ms"), control=without("timeout", deadline=3.0)),
    row("res.output-flood", "resources",
        f"write 16 MiB to stdout (output = {OUTPUT_LIMIT >> 10} KiB)", "res_flood.py",
        str(16 << 20), expect=OutputCut(OUTPUT_LIMIT), proven=off("output_cap"),
        setup=setups.heartbeat(), policy=_limits(output=format_size(OUTPUT_LIMIT)),
        control=without("output_cap")),
    row("res.output-to-a-file", "resources",
        f"stdout appended to a host file: truncate it, write 16 MiB (output = "
        f"{OUTPUT_LIMIT >> 10} KiB)", "res_file_out.py", str(16 << 20),
        expect=denied(by("stdio_relay", "EINVAL")),
        proven=(off("stdio_relay"), off("output_cap")), setup=setups.appended_file(OUTPUT_LIMIT),
        launch=launches.from_the_callers_streams,
        policy=_limits(output=format_size(OUTPUT_LIMIT))),
    # --- lifecycle -------------------------------------------------------------------------
    row("life.daemon", "lifecycle", "double-fork a setsid daemon and exit", "life_daemon.py",
        expect=Completed("daemon", "the daemon dies with the sandbox (pid namespace)"),
        proven=off("pid_namespace"), control=without("pid_namespace")),
    row("life.keeper", "lifecycle",
        "disarm what reaps the tree (its parent): its RLIMIT_NOFILE 0 and RLIMIT_NPROC 1; then "
        "double-fork a setsid daemon and exit",
        "life_keeper.py",
        expect=Completed("daemon", "the daemon dies with the sandbox (pid namespace), "
                                   "whatever its pid 1 was made to bear"),
        proven=off("pid_namespace"), policy=_limits(timeout="4s"),
        control=without("pid_namespace", deadline=6.0)),
    row("life.owner-killed", "lifecycle",
        "the process that launched the sandbox is killed with SIGKILL while a daemon runs",
        "life_daemon.py", "stay", expect=launches.OwnerKilled(), proven=off("lifeline"),
        launch=launches.owner_killed, control=without("lifeline")),
    row("life.timeout", "lifecycle", "outlive the timeout (1 s) with a daemon",
        "life_daemon.py", "stay", expect=EndedBy("limits.timeout", 4.0),
        proven=(off("timeout"), off("pid_namespace")), policy=_limits(timeout="1s"),
        control=without("timeout", deadline=2.5)),
    row("life.cancel", "lifecycle", "keep running with a daemon until cancelled",
        "life_daemon.py", "stay", expect=EndedBy("cancelled", 4.0),
        proven=(off("lifeline"), off("pid_namespace")), setup=setups.cancel_once_running(2),
        control=without("lifeline", deadline=2.5)),
    row("life.soak", "lifecycle",
        f"{SOAK_LAUNCHES} concurrent launches, each reading its neighbours' workspaces",
        "soak.py", expect=launches.Soak(OUTSIDE), proven=VIEW_AND_LANDLOCK,
        launch=launches.soak(SOAK_LAUNCHES), setup=setups.soak_workspaces(SOAK_LAUNCHES)),
    # --- Stockade's own helpers ---------------------------------------------------------------
    row("helpers.state-dir", "helpers",
        "with a daemon serving from a state directory inside the workspace: list it, read its "
        "attestation, connect to cli.sock and daemon.sock", "helper_state.py", "list:{state}",
        "read:{state}/attestation-linux.json", "connect:{state}/cli.sock",
        "connect:{state}/daemon.sock", expect=denied(by("stockade_state", "EACCES")),
        proven=off("stockade_state"), preset="read-only", setup=setups.state_in_workspace),
    row("helpers.servers", "helpers",
        "reach the daemon and the CLI server (sockets in the workspace): a session and a run "
        "that write outside, the session list", "helper_servers.py",
        "{outside}", "daemon:{ws}/daemon.sock", "cli:{ws}/cli.sock",
        expect=denied(by("peer_check", "PEER_REFUSED", "NOT_SERVED"),
                      by("unix_sockets", "EACCES", "ECONNREFUSED")),
        proven=off("peer_check", "unix_sockets"), preset="read-only",
        launch=launches.against_servers),
    row("helpers.served-host-code", "helpers",
        "rewrite the script of the host's `stockade` client, in the workspace, from a run a CLI "
        "server serves that client", "tamper.py", "{client}", expect=denied(HOST_CODE),
        unproven=SERVED, setup=setups.client_script_in_workspace,
        launch=launches.served_by_a_cli_server),
    row("helpers.planted-servers", "helpers",
        "plant cli.sock and daemon.sock where the host's clients look for the state directory, "
        "and hear what a host `stockade run` and `stockade session list` send",
        "helper_planted.py", "{ws}/state", "{ws}/done",
        expect=denied(by("server_check", "NOTHING_SENT")), proven=off("server_check"),
        launch=launches.planted_servers),
    row("helpers.planted-changes", "helpers",
        "plant a change set whose root is outside and whose `created` lies in the future where "
        "the host's `stockade apply` looks for its state directory", "helper_planted_changes.py",
        "{ws}/state", "{outside}", "{ws}/answer", "future",
        expect=denied(by("change_store_check", "changes_untrusted")),
        # (the seal refuses it too: the two are off together)
        proven=off("change_store_check", "change_seal"), launch=launches.planted_changes,
        # (on the host the apply refuses just the same: the check is the host's own)
        control=without("change_store_check", "change_seal")),
    row("helpers.change-set-store", "helpers",
        "tamper with a pending change set in Stockade's state directory: user.overlay.opaque "
        "on its upper layer (apply would delete host files), other extended attributes, "
        "chmod 0777 of the state directory", "helper_xattr.py", "{state}", "{upper}",
        expect=denied(by("mount_view", "ENOENT")), proven=off("mount_view"),
        setup=setups.change_set_store),
    row("helpers.forged-changes", "helpers",
        "plant a change set whose root is outside, made to pass every check of the store "
        "(modes, no links, `created` a moment ago) with a seal of its own making, where the "
        "host's `stockade apply` looks for its state directory", "helper_planted_changes.py",
        "{ws}/state", "{outside}", "{ws}/answer", "past",
        expect=denied(by("change_seal", "changes_untrusted")),
        proven=off("change_seal"), launch=launches.planted_changes,
        control=without("change_seal")),
    row("helpers.forged-state-dir", "helpers",
        "build a whole state directory where the host's `stockade apply` looks for one (C1: "
        "its environment is not the agent's): a key of its own, where an older Stockade read "
        "it and under this one's name, and a change set whose root is outside, sealed with it",
        "helper_planted_changes.py", "{ws}/state", "{outside}", "{ws}/answer", "keyed",
        expect=denied(by("change_seal_key", "changes_untrusted")),
        proven=(off("change_seal_key"), off("change_seal")), launch=launches.planted_changes,
        control=without("change_seal_key")),
    # --- VM containment (a QEMU guest per row) -----------------------------------------------
    row("vm.guest-kernel", "vm",
        "in a guest: set the kernel's core-dump, modprobe, hotplug and uevent helpers, trigger "
        "sysrq, unmount /proc and the root", "vm_kernel.py",
        expect=denied(by("kernel", "EROFS", "EACCES", "EPERM")), unproven=VM_UNPROVEN,
        launch=launches.in_a_guest, control=None,
        uncontrolled="run anywhere it works, it would change that kernel's settings"),
    row("vm.hardlink", "vm",
        "in a guest: write through a hard link planted before boot to an outside file; link "
        "outside and read-only files", "fs_hardlink.py", "{ws}/hard", "{secret_file}",
        "{root}/ro/file", expect=denied(by("kernel", "EROFS", "ENOENT", "EXDEV")),
        unproven=VM_UNPROVEN, setup=setups.planted_hard_link, launch=launches.in_a_guest),
    row("vm.protected-nested", "vm", "in a guest: " + NESTED_ATTEMPT, "tamper.py",
        *NESTED_TARGETS, expect=denied(by("kernel", "EROFS", "EBUSY")), unproven=VM_UNPROVEN,
        setup=setups.nested_repository, launch=launches.in_a_guest),
)
