"""The mutation suite's table (issue 30 part 1): for security properties SECURITY.md claims, the
smallest careless change that removes one (a line a refactor could drop or bend), and the
tests that must then fail. scripts/mutants.py applies each alone to a private copy of the tree
(rebuilding the C programs there for a mutant of a .c or .h file) and runs its tests there;
tests/test_mutants.py keeps the table in step with the code (each
old text is found exactly once, each test exists). docs/testing.md says how to run it.

Not collected by pytest (no test_ prefix): it is data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str                # the file mutated, relative to the repository
    old: str                 # text found exactly once in it
    new: str                 # what replaces it
    tests: tuple[str, ...]   # pytest node ids: at least one must fail
    owner: str = ""          # someone else's to run (said, not run), or "" for ours
    # Whether its tests show the property only to a user who is not root (root may list and
    # search every directory: as root they pass whatever the code, so a root run does not
    # count them, and says so).
    rootless: bool = False


INTEGRATIONS = "tests/integrations/"  # (their tests run with the frameworks installed)
OVERLAY = "tests/test_overlay.py::"
STORE = "tests/test_change_store.py::"
MASKS = "tests/test_linux_masks.py::"
ENV = "tests/test_env_refusal.py::"
HOST = "tests/test_host_code.py::"
PUMP, API, CLI = "tests/test_pump.py::", "tests/test_api.py::", "tests/test_cli.py::"
PROBE_WEAK = "tests/test_probe.py::test_a_weakened_layer_fails_readiness_at_its_stage"
PROCESS = "tests/test_linux_process.py::"
STATUS = "tests/test_linux_status.py::"
CREATE = "tests/test_protected_create.py::"
MEMFD = "tests/test_memfd_exec.py::"
ALIAS = "tests/test_home_alias.py::"
DENIED = "tests/test_deny_every_name.py::"
KEEP = "tests/test_session_keep_detached.py::"
FENCE = "tests/test_windows_fence.py::"
FENCE_SERVICE = "tests/test_windows_fence_service.py::"
WFP = "tests/test_windows_wfp.py::"
BROKER = "tests/test_windows_broker.py::"
# (an evidence row of tests/test_evidence_network.py, run on its own: first, so that the run
# says the row caught the mutant)
EVIDENCE_NET = "tests/test_evidence_network.py::test_the_row_passes_with_its_control["
WSB = "tests/test_vm_wsb.py::"
PROXY_ENV = "tests/test_windows_proxy_env.py::"
WSB_AGENT = "tests/test_vm_wsb_agent.py::"
WSB_DAEMON = "tests/test_vm_wsb_daemon.py::"
WSB_LEDGER = "tests/test_vm_wsb_ledger.py::"
PROCID = "tests/test_windows_procid.py::"
WINDOWS_PROBE = "tests/test_windows_probe.py::"
OVERLAY_UNJUDGED = ("tests/test_deny_links.py::test_an_overlay_whose_layers_cannot_be_judged_is"
                    "_refused_in_or_above_a_root")

MUTANTS: tuple[Mutant, ...] = (
    # the CLI server a run starts by itself: the caller's cwd (perhaps a workspace) is not on
    # its import path, and it serves only its own cgroup
    Mutant("autoserver-imports-from-the-cwd", "stockade/cli/autoserver.py",
           '"-P", "-m", __name__], cwd="/",', '"-m", __name__], cwd=None,',
           ("tests/test_autoserver.py::"
            "test_the_callers_working_directory_is_not_on_the_servers_import_path",)),
    Mutant("autoserver-started-in-the-callers-directory", "stockade/cli/autoserver.py",
           '__name__], cwd="/",', "__name__], cwd=None,",
           ("tests/test_autoserver.py::test_a_relative_import_path_entry_of_the_caller_names"
            "_nothing_of_its_directory",)),
    Mutant("autoserver-started-under-a-tracer", "stockade/cli/autoserver.py",
           "idle_seconds(dict(os.environ)) is None or _traced():",
           "idle_seconds(dict(os.environ)) is None:",
           ("tests/test_autoserver.py::test_a_traced_run_starts_no_server",)),
    Mutant("autoserver-lock-not-taken", "stockade/lifecycle/lease.py",
           "    try:\n        acquire(fd, wait=False)\n", "    try:\n        pass\n",
           ("tests/test_autoserver.py::test_one_server_at_a_time_whatever_starts_together",)),
    Mutant("cli-server-judges-its-own-host-code", "stockade/cli/server.py",
           "            request.program.become()\n", "            pass\n",
           ("tests/test_autoserver.py::test_a_served_run_keeps_its_clients_own_code_read_only",)),
    Mutant("cli-server-serves-another-venv", "stockade/cli/server.py",
           "and request.program.imports_as(imports)):", "and True):",
           ("tests/test_autoserver.py::test_a_client_of_another_interpreter_or_venv_is_not"
            "_served",)),
    Mutant("cli-server-serves-what-imported-otherwise", "stockade/cli/server.py",
           "return (self.kind() == own.facts and own.modules.issuperset(self.modules)",
           "return (self.kind() == own.facts",
           ("tests/test_autoserver.py::test_a_client_that_imports_otherwise_is_not_served"
            "[module-of-its-own]",)),
    Mutant("cli-server-ignores-cache-prefix-and-user-site", "stockade/cli/server.py",
           "                self.pycache_prefix, self.user_site)", "                )",
           ("tests/test_autoserver.py::test_a_client_that_imports_otherwise_is_not_served"
            "[pycache-prefix]",
            "tests/test_autoserver.py::test_a_client_that_imports_otherwise_is_not_served"
            "[user-base]")),
    Mutant("cli-server-starts-where-the-request-is", "stockade/cli/server.py",
           "stockade._started_in = self.started_in or None", "stockade._started_in = None",
           ("tests/test_autoserver.py::test_a_served_run_starts_where_its_client_started",)),
    Mutant("cli-server-loses-what-it-cannot-read", "stockade/cli/server.py",
           "not lost: attack B9)\n                _turn_away(conn)\n",
           "not lost: attack B9)\n                conn.close()\n",
           ("tests/test_autoserver.py::test_a_request_the_server_cannot_read_runs_here",)),
    Mutant("cli-server-runs-changed-code", "stockade/cli/server.py",
           "            if _changed(waiting.installed):", "            if False:",
           ("tests/test_autoserver.py::test_a_server_whose_code_changed_on_disk_ends",)),
    Mutant("cli-server-serves-another-nice-value", "stockade/linux/peer.py",
           '"Cpus_allowed_list", "sched", "oom_score_adj")', '"Cpus_allowed_list")',
           ("tests/test_autoserver.py::test_a_client_with_another_nice_value_is_not_served",)),
    Mutant("autoserver-never-idles-out", "stockade/cli/server.py",
           "deadline = None if waiting.idle is None else", "deadline = None if True else",
           ("tests/test_autoserver.py::test_the_server_ends_by_itself_when_unused",)),
    Mutant("autoserver-serves-any-cgroup", "stockade/cli/autoserver.py",
           "idle=idle, context=peer.STARTED_CONTEXT)", "idle=idle, context=peer.RUN_CONTEXT)",
           ("tests/test_autoserver.py::test_a_client_in_another_cgroup_is_not_served",)),
    # --- the audit's nine (issue 30) -------------------------------------------------------
    Mutant("apply-follows-swapped-dir", "stockade/lifecycle/changeapply.py",
           "    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,",
           "    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,",
           (OVERLAY + "test_apply_never_walks_through_a_link_swapped_in_after_the_check",)),
    Mutant("apply-follows-swapped-root", "stockade/lifecycle/changeapply.py",
           "roots[root] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | "
           "os.O_CLOEXEC)",
           "roots[root] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)",
           (OVERLAY + "test_apply_never_writes_through_a_write_root_swapped_for_a_link",)),
    Mutant("ipv6-guard-outside-global-unicast", "stockade/net/addresses.py",
           '    v6 += [(net, "reserved") for net in _outside_global_unicast()]\n',
           "\n",
           ("tests/test_network_any_ipv6.py::"
            "test_the_guard_refuses_every_ipv6_address_the_proxy_refuses",)),
    Mutant("landlock-tier-home-code-made", "stockade/linux/backend.py",
           "            if request.unmade:  # (Landlock rules hold paths that exist: none "
           "is made)",
           "            if False:",
           ("tests/test_home_code.py::"
            "test_the_landlock_tier_refuses_a_write_root_where_the_homes_code_would_be_made",)),
    Mutant("home-link-unresolved", "stockade/launch/homecode.py",
           "    return sorted({*named, *map(os.path.realpath, named)})",
           "    return sorted(set(named))",
           ("tests/test_home_code.py::test_a_home_reached_through_a_link_keeps_every_hidden_entry",)),
    Mutant("guard-own-address-stays-inside", "stockade/linux/guard.py",
           "    for version in (4, 6) if guarded else ():\n        if own[version]:",
           "    for version in (4, 6) if guarded else ():\n        if False:",
           ("tests/test_network_any.py::"
            "test_the_hosts_own_address_is_refused_and_said_within_a_reached_range",)),
    Mutant("guard-host-translated-forms", "stockade/linux/guard.py",
           "            nets[6] += map(str, addresses.carried_forms("
           "ipaddress.IPv4Network(address)))",
           "            pass",
           ("tests/test_network_any_ipv6.py::"
            "test_the_guard_refuses_the_translated_forms_of_the_hosts_own_ipv4_addresses",)),
    Mutant("credential-token", "stockade/launch/env.py",
           'r"(^|_)(TOKEN|SECRET|', 'r"(^|_)(SECRET|',
           (ENV + "test_every_credential_pattern_is_refused_by_name",
            ENV + "test_a_credential_passed_to_a_real_run_never_reaches_the_child")),
    Mutant("credential-api-key", "stockade/launch/env.py",
           "|PASSPHRASE|APIKEY|API_KEY|ACCESS_KEY|", "|PASSPHRASE|APIKEY|ACCESS_KEY|",
           (ENV + "test_every_credential_pattern_is_refused_by_name",)),
    Mutant("credential-cookie", "stockade/launch/env.py",
           '|CREDENTIALS?|AUTH|COOKIE)(_|$)"', '|CREDENTIALS?|AUTH)(_|$)"',
           (ENV + "test_every_credential_pattern_is_refused_by_name",)),
    Mutant("credential-vendor-prefix", "stockade/launch/env.py",
           '|^(AWS|AZURE|GOOGLE_APPLICATION|GCP|OPENAI|ANTHROPIC|',
           '|^(AWS|AZURE|GOOGLE_APPLICATION|GCP|OPENAI|',
           (ENV + "test_every_credential_pattern_is_refused_by_name",)),
    Mutant("state-dir-ignores-xdg", "stockade/lifecycle/statedir.py",
           "    if os.path.isabs(xdg):\n        found.append(os.path.join(xdg, \"stockade\"))\n",
           "",
           (MASKS + "test_every_state_directory_source_is_masked",)),
    Mutant("state-dir-ignores-home-default", "stockade/lifecycle/statedir.py",
           '    found.append(os.path.join(home, ".local", "state", "stockade"))\n', "",
           (MASKS + "test_every_state_directory_source_is_masked",)),
    Mutant("state-dir-ignores-explicit", "stockade/lifecycle/statedir.py",
           "    if explicit:\n        found.append(explicit)\n", "",
           (MASKS + "test_every_state_directory_source_is_masked",)),
    Mutant("change-set-dir-world-writable", "stockade/lifecycle/changes.py",
           "            os.mkdir(path, 0o700)\n            return\n",
           "            os.mkdir(path, 0o777)\n            return\n",
           (STORE + "test_a_change_set_is_private_whatever_the_umask",)),
    Mutant("change-store-parents-makedirs", "stockade/lifecycle/changes.py",
           "        os.mkdir(path, 0o700)\n    except FileExistsError:\n        pass\n",
           "        os.makedirs(path, exist_ok=True)\n    except FileExistsError:\n        pass\n",
           (STORE + "test_a_change_set_is_private_whatever_the_umask",)),
    Mutant("change-set-work-dir-group-writable", "stockade/lifecycle/changes.py",
           "            os.mkdir(os.path.join(layer, WORK), 0o700)\n        meta[\"seal\"]",
           "            os.mkdir(os.path.join(layer, WORK), 0o770)\n        meta[\"seal\"]",
           (STORE + "test_a_change_set_is_private_whatever_the_umask",)),
    Mutant("probe-descriptors-always-pass", "stockade/linux/probe.py",
           '"descriptors": {"inherited_fds": _equal([0, 1, 2])},',
           '"descriptors": {"inherited_fds": (lambda v: True, "anything")},',
           (PROBE_WEAK + "[descriptors-descriptors_not_enforced-descriptors-inherited_fds]",)),
    Mutant("probe-environment-always-pass", "stockade/linux/probe.py",
           '"environment": {"environment": _equal(sorted(name for name, _ in PROBE_ENV))},',
           '"environment": {"environment": (lambda v: True, "anything")},',
           (PROBE_WEAK + "[environment-environment_not_enforced-environment-environment]",)),
    Mutant("apply-keeps-setuid", "stockade/lifecycle/changescan.py",
           "    return stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID)",
           "    return stat.S_IMODE(mode)",
           (OVERLAY + "test_apply_never_lands_setuid_or_setgid_bits",)),
    Mutant("apply-keeps-setgid", "stockade/lifecycle/changescan.py",
           "    return stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID)",
           "    return stat.S_IMODE(mode) & ~stat.S_ISUID",
           (OVERLAY + "test_apply_never_lands_setuid_or_setgid_bits",)),
    *(Mutant(f"relayed-output-uncapped-{where}", "stockade/launch/pump.py",
             "    return Forward(limit, fd=where)", "    return Forward(sys.maxsize, fd=where)",
             (test,))
      for where, test in (("pump", PUMP + "test_relayed_output_is_cut_at_the_limit"),
                          ("api", API + "test_relayed_output_is_cut_at_the_output_limit"),
                          ("cli", CLI + "test_relayed_output_is_cut_at_the_output_limit"))),
    # --- more of SECURITY.md's claims ------------------------------------------------------
    Mutant("loader-prefix-ld", "stockade/launch/env.py",
           'LOADER_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")',
           'LOADER_PREFIXES = ("DYLD_", "BASH_FUNC_")',
           ("tests/test_linux_process.py::test_loader_injection_is_refused",)),
    Mutant("seccomp-ptrace-allowed", "stockade/linux/seccomp.py",
           '    "ptrace", "process_vm_readv",', '    "process_vm_readv",',
           ("tests/test_linux_layers.py::test_seccomp_denies_ptrace",)),
    Mutant("seccomp-setuid-chmod-allowed", "stockade/linux/seccomp.py",
           "for call, arg in _MODE_ARGUMENT.items() for bit in _PRIVILEGE_BITS]",
           "for call, arg in _MODE_ARGUMENT.items() for bit in ()]",
           ("tests/test_helpers_boundary.py::test_no_privilege_bit_can_be_set_in_a_write_root",)),
    Mutant("seccomp-any-socket-family", "stockade/linux/seccomp.py",
           "              if family not in ALLOWED_FAMILIES.values()]",
           "              if family not in ALLOWED_FAMILIES.values() and family != 17]",
           ("tests/test_helpers_boundary.py::"
            "test_sockets_of_families_a_network_namespace_does_not_isolate_fail[none]",)),
    Mutant("pins-forget-masked-paths", "stockade/linux/protect.py",
           "    for path in masked:\n        _pin_everywhere(keep, roots, path)\n",
           "",
           (MASKS + "test_a_denied_path_stays_denied_after_its_parents_are_renamed",)),
    Mutant("hard-link-left-writable", "stockade/linux/protect.py",
           "if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:",
           "if stat.S_ISREG(info.st_mode) and info.st_nlink > 2:",
           ("tests/test_linux_fs.py::test_pre_planted_hard_link_to_outside_file_is_read_only",)),
    Mutant("deny-links-counted-by-path", "stockade/linux/protect.py",
           "             if len(known.places) < known.links}\n",
           "             if len(known.names) < known.links}\n",
           ("tests/test_deny_links.py::"
            "test_a_name_a_bind_mount_shows_twice_counts_once[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_name_a_bind_mount_shows_twice_counts_once[landlock]")),
    Mutant("deny-unlisted-passed-over", "stockade/linux/protect.py",
           "            if unlisted is not None and os.access(rel or \".\", os.X_OK, "
           "dir_fd=root_fd):\n",
           "            if False:\n",
           ("tests/test_deny_links.py::"
            "test_a_denied_directory_that_can_be_entered_but_not_listed_never_shows_its_files"
            "[landlock]",),
           rootless=True),
    Mutant("write-root-unread-passed-over", "stockade/linux/protect.py",
           "            own = _own(rel or \".\", root_fd)\n",
           "            own = False\n",
           ("tests/test_deny_links.py::"
            "test_a_directory_of_the_users_the_walk_cannot_read_refuses_the_launch[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_directory_of_the_users_the_walk_cannot_read_refuses_the_launch[landlock]"),
           rootless=True),
    Mutant("write-root-others-unlisted-passed-over", "stockade/linux/protect.py",
           "            if unlisted is None and (own or os.access(rel or \".\", os.X_OK, "
           "dir_fd=root_fd)):\n",
           "            if unlisted is None and own:\n",
           ("tests/test_deny_links.py::test_another_users_directory_the_command_may_enter_but_not"
            "_list_refuses_the_launch[namespaces]",
            "tests/test_deny_links.py::test_another_users_directory_the_command_may_enter_but_not"
            "_list_refuses_the_launch[landlock]")),
    Mutant("deny-link-unmasked", "stockade/linux/protect.py",
           "            elif occ.linked and denied and occ.inode in denied:\n",
           "            elif False:\n",
           ("tests/test_deny_links.py::"
            "test_a_hard_link_of_a_denied_file_in_a_write_root_is_denied_too[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_hard_link_of_a_denied_file_in_a_write_root_is_denied_too[landlock]")),
    Mutant("deny-link-mount-alias-unmasked", "stockade/linux/protect.py",
           "                for name in [path, *mount_aliases.seen(path, list(shown_in), "
           "mounts[0])]:\n",
           "                for name in [path]:\n",
           ("tests/test_deny_links.py::"
            "test_a_link_a_read_root_shows_through_a_bind_mount_is_denied_there_too[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_link_a_read_root_shows_through_a_bind_mount_is_denied_there_too[landlock]")),
    Mutant("mount-of-removed-name-admitted", "stockade/launch/compile.py",
           "    _refuse_unjudged_mounts(read, write)\n", "\n",
           ("tests/test_deny_links.py::test_a_bind_of_a_link_since_removed_still_shows_nothing"
            "[namespaces]",
            "tests/test_deny_links.py::test_a_bind_of_a_link_since_removed_still_shows_nothing"
            "[landlock]")),
    Mutant("landlock-rule-above-excluded-admitted", "stockade/linux/landlock_tier.py",
           "    _refuse_rules_above_excluded(out, excluded)\n", "\n",
           ("tests/test_deny_links.py::test_a_read_root_binding_a_directory_above_a_denied_mount"
            "_is_refused_by_the_tier[landlock]",
            "tests/test_deny_links.py::test_write_roots_that_bind_each_other_never_show_a_denied"
            "_file[landlock]")),
    Mutant("landlock-read-root-unsearchable-denied-dropped", "stockade/launch/compile.py",
           'modes_held=policy.isolation != "landlock")', "modes_held=True)",
           (DENIED + "test_a_denied_path_below_a_directory_of_the_users_it_may_not_search_in_a"
            "_read_root[landlock]",),
           rootless=True),
    Mutant("denied-path-link-owner-judged", "stockade/launch/compile.py",
           "                above = os.path.realpath(aliases.first_unsearchable(alias))\n",
           "                above = aliases.first_unsearchable(alias)\n",
           (DENIED + "test_a_denied_path_named_through_another_users_link_to_the_users_own"
            "_directory[landlock]",),
           rootless=True),
    Mutant("denied-unsearched-shown-unmasked", "stockade/lifecycle/aliases.py",
           "            if name != place and held(name) and os.path.lexists(name):\n",
           "            if False:\n",
           (DENIED + "test_a_denied_path_below_another_users_directory_is_denied_where_a_mount"
            "_shows_it[namespaces]",
            DENIED + "test_a_denied_path_below_another_users_directory_is_denied_where_a_mount"
            "_shows_it[landlock]"),
           rootless=True),
    Mutant("protected-bind-alias-writable", "stockade/linux/protect.py",
           "    _protect_other_names(items, keep, roots)\n", "\n",
           ("tests/test_deny_links.py::test_a_protected_object_a_bind_mount_shows_elsewhere_in_a"
            "_write_root_stays_read_only[.mcp.json-namespaces]",
            "tests/test_deny_links.py::test_a_protected_object_a_bind_mount_shows_elsewhere_in_a"
            "_write_root_stays_read_only[.git/hooks-landlock]")),
    Mutant("protected-root-alias-unseen", "stockade/linux/protect.py",
           '            and not any(mount_aliases.within("/", root, mounts) != [root] '
           "for root in writes):\n",
           "            and True:\n",
           ("tests/test_deny_links.py::test_a_write_root_that_is_a_guarded_directory_under"
            "_another_name_stays_read_only[namespaces]",)),
    Mutant("mount-table-last-listed-on-top", "stockade/lifecycle/aliases.py",
           "        seen = next((m for m in mounts if m.id == resolved), None)\n",
           "        seen = mounts[-1]\n",
           ("tests/test_deny_links.py::test_a_mount_of_a_removed_name_on_top_of_another_is_seen"
            "[namespaces]",
            "tests/test_deny_links.py::test_a_mount_on_the_root_over_the_processs_own_hides"
            "_nothing")),
    Mutant("denied-path-through-repointable-link", "stockade/launch/compile.py",
           "        if holder is not None and not kept:\n", "        if False:\n",
           (DENIED + "test_a_denied_path_reached_through_a_link_in_a_write_root_is_refused"
            "[namespaces]",
            DENIED + "test_a_denied_path_reached_through_a_link_in_a_write_root_is_refused"
            "[landlock]")),
    Mutant("unlooked-mount-admitted", "stockade/lifecycle/aliases.py",
           "    except OSError as exc:\n        raise _unlooked(path, exc) from None\n",
           "    except OSError as exc:\n        return None\n",
           ("tests/test_deny_links.py::test_a_mount_at_a_path_longer_than_the_kernel_takes_in_a"
            "_read_root_is_refused[namespaces]",)),
    Mutant("unlooked-own-directory-admitted", "stockade/lifecycle/aliases.py",
           "        raise _unlooked(path, exc) from None\n    except OSError as exc:\n",
           "        return None\n    except OSError as exc:\n",
           (DENIED + "test_a_mount_below_a_directory_this_user_may_not_search_in_a_read_root"
            "_is_refused[landlock]",),
           rootless=True),
    Mutant("overlay-of-denied-admitted", "stockade/launch/compile.py",
           "    refuse_overlays_of_denied(read, write, deny)\n", "\n",
           ("tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[plain-namespaces]",
            "tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[plain-landlock]")),
    Mutant("overlay-layer-judged-by-its-text", "stockade/launch/overlays.py",
           "            if _same_as(above, layer_is):\n", "            if above == layer:\n",
           ("tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[parent-link-namespaces]",
            "tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[parent-link-landlock]")),
    Mutant("overlay-unplain-layer-judged", "stockade/launch/overlays.py",
           "    if not aliases.plain(layer):\n        return None if container",
           "    if False:\n        return None if container",
           ("tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[relative-namespaces]",
            OVERLAY_UNJUDGED + "[relative-above-landlock]")),
    Mutant("overlay-unfound-layer-refused", "stockade/launch/overlays.py",
           "            continue  # (outside this view, as WSL's",
           "            return 'unfound'  # (outside this view, as WSL's",
           ("tests/test_deny_links.py::test_an_everyday_overlay_in_a_read_root_is_read_as_it_is[foreign-inside-namespaces]",)),
    Mutant("overlay-escaped-layer-judged", "stockade/lifecycle/aliases.py",
           '            and "\\\\" not in layer)', "            )",
           (OVERLAY_UNJUDGED + "[escaped-above-namespaces]",)),
    Mutant("overlay-layer-copies-admitted", "stockade/launch/compile.py",
           "    refuse_layer_copies(_denied_places(fs.deny, ctx) + list(places), read + write, "
           "deny)\n", "\n",
           ("tests/test_deny_links.py::test_a_denied_path_on_an_overlay_whose_layer_a_root_holds"
            "_is_refused_unless_denied_there[layer-in-root-landlock]",)),
    Mutant("overlay-layer-copies-unjudgeable-passed", "stockade/launch/overlays.py",
           "        if why:\n            return f\"(at {on.point}) whose layer {why}\"",
           "        if False:\n            return f\"(at {on.point}) whose layer {why}\"",
           ("tests/test_deny_links.py::test_a_denied_path_on_an_overlay_whose_layer_a_root_holds"
            "_is_refused_unless_denied_there[layer-escaped-landlock]",)),
    Mutant("overlay-layer-copies-bound-admitted", "stockade/launch/overlays.py",
           "        if seen:  # (a bind mount shows the layer", "        if False:  # (",
           ("tests/test_deny_links.py::test_a_denied_path_on_an_overlay_whose_layer_a_root_holds"
            "_is_refused_unless_denied_there[layer-bound-namespaces]",)),
    Mutant("overlay-layer-shared-admitted", "stockade/launch/overlays.py",
           "        if other is not None:\n", "        if False:\n",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[layer-shared-namespaces]",)),
    Mutant("overlay-beneath-bound-admitted", "stockade/launch/overlays.py",
           "            if names:\n", "            if False:\n",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[beneath-bound-landlock]",)),
    Mutant("overlay-state-places-unjudged", "stockade/launch/compile.py",
           "_denied_places(fs.deny, ctx) + list(places)", "_denied_places(fs.deny, ctx)",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[state-on-overlay-namespaces]",)),
    Mutant("overlay-data-only-layer-judged-for-copies", "stockade/launch/overlays.py",
           "    for layer in on.layers:\n", "    for layer in on.layers + on.data:\n",
           ("tests/test_deny_links.py::test_an_everyday_overlay_in_a_read_root_is_read_as_it_is[store-data-only-landlock]",)),
    Mutant("overlay-table-escapes-undecoded", "stockade/lifecycle/aliases.py",
           "        value = _unescaped(raw)\n", "        value = os.fsdecode(raw)\n",
           ("tests/test_deny_links.py::test_an_everyday_overlay_in_a_read_root_is_read_as_it_is[blank-slash-namespaces]",)),
    Mutant("overlay-shared-layer-by-path", "stockade/launch/overlays.py",
           "                      and _overlapping(real, shared, info)), None)",
           "                      and (inside(real, shared) or inside(shared, real))), None)",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[shared-bound-namespaces]",)),
    Mutant("overlay-shared-layer-unnested", "stockade/launch/overlays.py",
           "                pending.append((under, depth + 1))\n", "                pass\n",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[shared-nested-landlock]",)),
    Mutant("overlay-beneath-hidden-unfound", "stockade/lifecycle/aliases.py",
           "    under = mounts.by_id.get(mount.parent)\n",
           "    under = next((m for seen_ in mounts.of.values() for m in seen_ "
           "if m.id == mount.parent), None)\n",
           ("tests/test_deny_links.py::test_a_denied_path_an_overlay_holds_that_a_root_reaches_another"
            "_way_is_refused[beneath-source-namespaces]",)),
    Mutant("overlay-hidden-layer-judged", "stockade/launch/overlays.py",
           '    return "below its own point, which it hides: what that name named cannot be told"',
           '    return ""',
           (OVERLAY_UNJUDGED + "[covered-child-namespaces]",)),
    Mutant("overlay-covered-layer-unjudged", "stockade/launch/overlays.py",
           "            denied = _covered_denied(point, mount, deny, mounts)\n",
           "            denied = None\n",
           (OVERLAY_UNJUDGED + "[covered-bind-landlock]",)),
    Mutant("overlay-layer-copies-nested-unfollowed", "stockade/launch/overlays.py",
           "            why, _ = _layer_held(real, roots, masked, mounts, own_root, shown, "
           "depth + 1)\n",
           "            why = ''\n",
           ("tests/test_deny_links.py::test_a_denied_path_on_an_overlay_whose_layer_a_root_holds"
            "_is_refused_unless_denied_there[layer-nested-namespaces]",)),
    Mutant("overlay-nested-unfollowed", "stockade/launch/overlays.py",
           "        why = _overlay_unjudged(under.point, under, deny, mounts, own_root, depth + 1)"
           "\n",
           "        why = \"\"\n",
           (OVERLAY_UNJUDGED + "[nested-landlock]",)),
    Mutant("overlay-layer-inside-denied-by-bind-admitted", "stockade/launch/overlays.py",
           "        if not inside(point, grant.path) and any(\n",
           "        if False and any(\n",
           ("tests/test_deny_links.py::test_an_overlay_of_a_denied_directory_in_a_read_root_is"
            "_refused[bind-below-namespaces]",)),
    Mutant("overlay-proc-layer-judged", "stockade/launch/overlays.py",
           '    if aliases.at_or_below(layer, "/proc"):\n', "    if False:\n",
           (OVERLAY_UNJUDGED + "[proc-fd-landlock]",)),
    Mutant("host-code-other-name-unkept", "stockade/launch/compile.py",
           "        names = aliases.seen(resolved, roots, mounts)\n",
           "        names = []\n",
           (HOST + "test_the_host_code_shown_in_the_workspace_under_another_name_is_kept"
            "[bind-namespaces]",
            HOST + "test_the_interpreter_shown_in_the_workspace_under_another_name_is_kept"
            "[prefix-part]")),
    Mutant("host-code-mount-below-unseen", "stockade/launch/compile.py",
           "                names += [name for name in aliases.seen(point, roots, mounts) if "
           "name != point]\n",
           "                names += []\n",
           (HOST + "test_the_host_code_shown_in_the_workspace_under_another_name_is_kept"
            "[dir-onto-namespaces]",)),
    Mutant("host-code-start-kept-in-parts", "stockade/launch/compile.py",
           '    if place.kind == "start":\n        names = [name for root in roots',
           '    if False:\n        names = [name for root in roots',
           (HOST + "test_a_volume_in_the_workspace_stays_the_commands_when_run_from_the_root"
            "_directory",)),
    Mutant("host-code-linked-entries-unread", "stockade/launch/hostcode.py",
           "        found += [entry.path for entry in _listed(directory, listing)"
           " if entry.is_symlink()]\n",
           "        found += []\n",
           (HOST + "test_the_host_code_shown_in_the_workspace_under_another_name_is_kept"
            "[symlink-landlock]",)),
    Mutant("host-code-link-names-unchecked", "stockade/launch/compile.py",
           "            for name in [link, *aliases.seen(link, roots, mounts)]:\n",
           "            for name in [link]:\n",
           (HOST + "test_the_interpreter_shown_in_the_workspace_under_another_name_is_kept"
            "[link-chain]",)),
    Mutant("host-code-pycache-prefix-unread", "stockade/launch/hostcode.py",
           '              {sys.pycache_prefix, host_env.get("PYTHONPYCACHEPREFIX")} if prefix\n',
           "              {sys.pycache_prefix} if prefix\n",
           (HOST + "test_the_bytecode_cache_prefix_in_the_workspace_is_host_code",)),
    Mutant("host-code-editable-mapping-unread", "stockade/launch/hostcode.py",
           '        found += _module_places(path, "editable")\n', "        pass\n",
           (HOST + "test_a_package_an_editable_finder_maps_into_the_workspace_is_host_code",)),
    Mutant("host-code-link-tree-targets-unkept", "stockade/launch/compile.py",
           "              and _below(resolved, write) for link in hostcode.links_in(resolved)]",
           "              and _below(resolved, write) for link in ()]",
           (HOST + "test_the_files_a_link_tree_on_the_import_path_shows_are_host_code",)),
    Mutant("host-code-imported-modules-unread", "stockade/launch/hostcode.py",
           "        found += _module_places(path, \"module\")\n",
           "        pass\n",
           (HOST + "test_a_module_this_process_imported_from_the_workspace_is_host_code",)),
    Mutant("host-code-module-stem-taken-for-a-directory", "stockade/launch/hostcode.py",
           "    files = [path] if os.path.splitext(path)[1] else [",
           "    files = [path] if True else [",
           (HOST + "test_a_module_an_editable_finder_maps_is_kept_with_its_bytecode_cache",)),
    Mutant("host-code-relative-pycache-prefix-passed", "stockade/launch/hostcode.py",
           '              {sys.pycache_prefix, host_env.get("PYTHONPYCACHEPREFIX")} if prefix\n',
           '              {sys.pycache_prefix, host_env.get("PYTHONPYCACHEPREFIX")}\n'
           "              if prefix and os.path.isabs(prefix)\n",
           (HOST + "test_a_relative_bytecode_cache_prefix_is_host_code_where_it_resolves",)),
    Mutant("host-code-zip-module-taken-for-a-file", "stockade/launch/hostcode.py",
           "    if archive != path and os.path.isfile(archive):\n", "    if False:\n",
           (HOST + "test_a_module_imported_from_a_zip_file_in_the_workspace_keeps_the_archive",)),
    Mutant("host-code-start-covers-every-module-below", "stockade/launch/hostcode.py",
           'if place.kind not in ("script", "start", "prefix", "cwd")]',
           'if place.kind not in ("script", "prefix", "cwd")]',
           (HOST + "test_a_module_below_the_starting_directory_is_host_code_unless_imported"
            "_through_it",)),
    Mutant("host-code-start-link-taken-for-its-own", "stockade/launch/hostcode.py",
           "    if not aliases.at_or_below(real, top):\n        return False\n",
           "    if False:\n        return False\n",
           (HOST + "test_a_module_reached_through_the_top_of_the_starting_directory_is_host_code"
            "[package-link]",)),
    Mutant("host-code-start-mount-passed", "stockade/launch/hostcode.py",
           "    return not any(point != top and aliases.at_or_below(point, top)",
           "    return not any(False and aliases.at_or_below(point, top)",
           (HOST + "test_a_module_reached_through_the_top_of_the_starting_directory_is_host_code"
            "[bind]",)),
    Mutant("host-code-prefix-covers-modules", "stockade/launch/hostcode.py",
           'if place.kind not in ("script", "start", "prefix", "cwd")]',
           'if place.kind not in ("script", "start", "cwd")]',
           (HOST + "test_a_module_below_a_prefix_is_host_code",)),
    Mutant("host-code-finder-class-tables-unread", "stockade/launch/hostcode.py",
           '             for item in list(getattr(holder, "__dict__", {}).items())]',
           "             for item in ()]",
           (HOST + "test_a_package_a_finder_class_maps_is_host_code_unimported",)),
    Mutant("host-code-main-taken-for-imported", "stockade/launch/hostcode.py",
           '        if key == "__main__":\n', "        if False:\n",
           (HOST + "test_the_script_run_from_its_own_workspace_keeps_no_bytecode_cache",)),
    Mutant("host-code-shadowing-names-made", "stockade/launch/compile.py",
           "              and _below(resolved, write) for name in hostcode.shadowing(resolved)]",
           "              and _below(resolved, write) for name in ()]",
           (HOST + "test_no_name_an_import_takes_first_is_made_beside_a_module_the_host"
            "_imported[]",)),
    Mutant("host-code-missing-pycache-made", "stockade/linux/init.py",
           " - GIT_MAKES)) + request.unmade\n",
           " - GIT_MAKES)) + tuple(\n"
           "        name for name in request.unmade if not name.endswith('__pycache__'))\n",
           (HOST + "test_no_name_an_import_takes_first_is_made_beside_a_module_the_host"
            "_imported[]",)),
    Mutant("host-code-refusal-kind-unsaid", "stockade/launch/hostcode.py",
           '        kind = (request.host_code_kinds or ("package",))[0]\n',
           '        kind = "package"\n',
           (HOST + "test_the_landlock_refusal_says_what_the_host_code_is_and_what_takes_it_out"
            "[imported]",
            HOST + "test_the_landlock_refusal_says_what_the_host_code_is_and_what_takes_it_out"
            "[pycache-prefix]")),
    Mutant("host-code-erofs-unexplained", "stockade/cli/run.py",
           "        print_host_code_note(result)\n", "        pass\n",
           (CLI + "test_the_cli_says_why_a_write_to_host_code_failed",)),
    Mutant("host-code-relative-entries-skipped", "stockade/launch/hostcode.py",
           "              for entry in entries if isinstance(entry, str) and entry\n",
           "              for entry in entries if isinstance(entry, str)"
           " and os.path.isabs(entry)\n",
           (HOST + "test_a_relative_entry_on_the_import_path_is_the_directory_it_names",)),
    Mutant("host-code-missing-relative-entry-refused", "stockade/launch/hostcode.py",
           '                    else "searched")', '                    else "import_path")',
           (HOST + "test_a_path_hooks_key_on_the_import_path_is_not_made",)),
    Mutant("host-code-former-entries-unread", "stockade/launch/hostcode.py",
           '    found += [Place(path, "searched") for path in _searched(bases)',
           '    found += [Place(path, "searched") for path in ()',
           (HOST + "test_a_directory_once_on_the_import_path_is_host_code",)),
    Mutant("host-code-first-entry-taken-for-start", "stockade/launch/hostcode.py",
           "    start = _start_entry(started_in) if started_in else None\n",
           "    start = sys.path[0] if sys.path else None\n",
           (HOST + "test_an_entry_put_before_the_starting_directory_is_no_starting_directory"
            "[script]",
            HOST + "test_an_entry_put_before_the_starting_directory_is_no_starting_directory"
            "[module]")),
    Mutant("host-code-start-judged-from-here", "stockade/launch/hostcode.py",
           "    started_in = stockade._started_in or here\n",
           "    started_in = here\n",
           (HOST + "test_the_starting_directory_is_where_the_program_started_not_where_it_went"
            "[-m]",
            HOST + "test_the_starting_directory_is_where_the_program_started_not_where_it_went"
            "[-c]")),
    Mutant("host-code-missing-searched-skipped", "stockade/launch/hostcode.py",
           "            found += _located(key, bases) + (",
           "            found += [p for p in _located(key, bases) if os.path.lexists(p)] + (",
           (HOST + "test_a_missing_directory_the_imports_searched_is_not_made",)),
    Mutant("deny-link-overlay-layers-unlooked", "stockade/linux/protect.py",
           "                       for layer in (*mount.layers, *mount.data)})",
           "                       for layer in ()})",
           ("tests/test_deny_links.py::test_a_denied_files_link_in_a_layer_of_an_overlay_in_a"
            "_read_root_refuses[namespaces]",)),
    Mutant("host-code-moved-working-directory-unkept", "stockade/launch/hostcode.py",
           '        found.append(Place(moved_to, "cwd"))\n', "        pass\n",
           (HOST + "test_the_working_directory_empty_entry_names_is_host_code",)),
    Mutant("host-code-searched-below-start-passed", "stockade/launch/hostcode.py",
           '    on_path = [place.path for place in found if place.kind == "import_path"]',
           '    on_path = [place.path for place in found if place.kind in ("import_path",\n'
           '                                                               "start")]',
           (HOST + "test_a_directory_searched_below_the_starting_directory_is_host_code",)),
    Mutant("host-code-own-packages-kept", "stockade/launch/hostcode.py",
           "              if path not in (start_path, moved_to) and path not in own\n",
           "              if path not in (start_path, moved_to)\n",
           (HOST + "test_a_directory_searched_below_the_starting_directory_is_host_code",)),
    Mutant("host-code-extended-package-path-passed", "stockade/launch/hostcode.py",
           '    found += [Place(path, "package_path") for path in extended]',
           '    found += [Place(path, "package_path") for path in ()]',
           (HOST + "test_a_directory_a_package_was_given_besides_its_own_is_host_code[there]",)),
    Mutant("host-code-working-directory-above-refused", "stockade/launch/compile.py",
           '                or (place.kind in ("prefix", "cwd") and root.path != resolved):',
           '                or (place.kind in ("prefix",) and root.path != resolved):',
           (HOST + "test_a_working_directory_above_the_workspace_is_kept_only_whole",)),
    Mutant("host-code-removed-working-directory-crashes", "stockade/launch/hostcode.py",
           "    here = _working_directory()  #", "    here = os.getcwd()  #",
           (HOST + "test_a_removed_working_directory_is_no_crash",)),
    Mutant("host-code-originless-package-paths-own", "stockade/launch/hostcode.py",
           "                homes = {os.path.join(entry, last)\n",
           "                homes = set(paths) or {os.path.join(entry, last)\n",
           (HOST + "test_a_directory_any_package_was_given_is_host_code[namespace]",
            HOST + "test_a_directory_any_package_was_given_is_host_code[made-from-a-spec]")),
    Mutant("host-code-relative-package-path-dropped", "stockade/launch/hostcode.py",
           "    return [path for entry in list(entries) if isinstance(entry, str)\n",
           "    return [path for entry in list(entries) if isinstance(entry, str)"
           " and os.path.isabs(entry)\n",
           (HOST + "test_a_directory_any_package_was_given_is_host_code[relative-entry]",)),
    Mutant("host-code-module-file-package-owns-its-directory", "stockade/launch/hostcode.py",
           '            if isinstance(origin, str) and os.path.basename(origin).startswith('
           '"__init__."):\n',
           "            if isinstance(origin, str):\n",
           (HOST + "test_a_directory_any_package_was_given_is_host_code[module-made-a-package]",)),
    Mutant("host-code-run-time-site-pth-unread", "stockade/launch/hostcode.py",
           '        user_site, [place.path for place in found if place.kind == "import_path"],'
           ' listing)',
           "        user_site, [], listing)",
           (HOST + "test_a_missing_directory_a_pth_file_of_a_site_directory_added_at_run_time"
            "_names",)),
    Mutant("host-code-overlay-layer-admitted", "stockade/launch/compile.py",
           "    refuse_host_code_copies(list(dict.fromkeys(resolved for _, resolved in found)), "
           "write, deny)\n",
           "\n",
           (HOST + "test_the_host_code_shown_in_the_workspace_under_another_name_is_kept"
            "[overlay-upper-landlock]",)),
    Mutant("overlay-own-root-judged", "stockade/launch/overlays.py",
           "        return None if container else",
           "        return None if False else",
           ("tests/test_deny_links.py::test_only_the_overlay_the_processs_own_root_is_goes"
            "_unjudged[/]",)),
    Mutant("deny-link-unfound-allowed", "stockade/linux/protect.py",
           "             if len(known.places) < known.links}\n", "             if False}\n",
           ("tests/test_deny_links.py::"
            "test_a_denied_file_linked_into_a_read_root_refuses_the_launch[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_denied_file_linked_into_a_read_root_refuses_the_launch[landlock]")),
    Mutant("deny-link-in-read-root-unlooked-for", "stockade/linux/protect.py",
           "        _look_in_read_roots(unmet, read)\n", "        pass\n",
           ("tests/test_deny_links.py::"
            "test_a_denied_file_linked_into_a_read_root_refuses_the_launch[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_denied_file_linked_into_a_read_root_refuses_the_launch[landlock]")),
    Mutant("deny-link-outside-every-root-refused", "stockade/linux/protect.py",
           "        _look_in_read_roots(unmet, read)\n",
           '        raise _unfound(next(iter(unmet.values())), "not looked for")\n',
           ("tests/test_deny_links.py::"
            "test_a_denied_file_linked_outside_every_root_is_no_refusal[namespaces]",
            "tests/test_deny_links.py::"
            "test_a_denied_file_linked_outside_every_root_is_no_refusal[landlock]")),
    Mutant("deny-link-read-root-unlisted-passed-over", "stockade/linux/protect.py",
           "            or os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == "
           "os.geteuid():\n",
           "            or False:\n",
           ("tests/test_deny_links.py::"
            "test_a_read_root_the_launch_cannot_look_through_keeps_the_refusal[landlock]",),
           rootless=True),
    Mutant("denied-paths-unmasked", "stockade/linux/mnt.py",
           "    _mask(top, [m for m in denied if m not in later], lower)\n",
           "    _mask(top, [], lower)\n",
           ("tests/test_linux_fs.py::test_denied_path_inside_a_granted_root_is_masked",)),
    Mutant("git-hooks-writable", "stockade/linux/gitdirs.py",
           '                self._require(os.path.join(gitdir, "hooks"), True, made=True)\n',
           "",
           ("tests/test_linux_git.py::test_a_gitdir_without_hooks_gets_empty_read_only_ones",)),
    Mutant("server-dir-others-writable-trusted", "stockade/lifecycle/lease.py",
           "        return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)",
           "        return not info.st_mode & stat.S_IWOTH",
           ("tests/test_server_clients.py::test_a_server_in_a_directory_others_can_write_is_not_used",)),
    Mutant("change-set-future-created-trusted", "stockade/lifecycle/changes.py",
           "    if not isinstance(created, int | float) or created > time.time() + CLOCK_SLACK:",
           "    if not isinstance(created, int | float):",
           (STORE + "test_a_set_dated_in_the_future_is_refused_even_with_a_seal_that_verifies",)),
    Mutant("review-shows-control-characters", "stockade/visibletext.py",
           "    if not escaped or text.isprintable()", "    if not escaped or True",
           (OVERLAY + "test_the_review_escapes_what_would_fool_a_terminal",)),
    Mutant("violation-names-raw", "stockade/launch/result.py",
           '"detail", visible(self.detail))', '"detail", self.detail)',
           ("tests/test_protected_create.py::"
            "test_a_name_the_command_chose_reaches_the_violations_escaped",
            CLI + "test_a_name_the_command_chose_is_escaped_in_stockades_own_lines")),
    Mutant("error-message-raw", "stockade/errors.py",
           '        message = "\\n".join(visible(line) for line in lines)\n', "",
           (CLI + "test_a_refusal_quoting_what_the_command_chose_is_escaped",)),
    Mutant("review-shows-blank-characters", "stockade/visibletext.py",
           " or bool(_BLANK.match(char))", "",
           (OVERLAY + "test_the_review_escapes_characters_that_render_blank",)),
    Mutant("review-hides-added-modes", "stockade/lifecycle/changeview.py",
           '    return bool(change.mode & {"file": 0o111 | 0o022, "dir": 0o022}',
           '    return bool(change.mode & {"file": 0, "dir": 0}',
           (OVERLAY + "test_the_review_shows_the_notable_modes_of_what_the_run_added",)),
    Mutant("landlock-tier-inotify-allowed", "stockade/linux/seccomp.py",
           "    if not inotify:\n        rules += [(call, errno.ENOSYS, ()) for call in "
           "INOTIFY_CALLS]\n", "",
           ("tests/test_landlock_tier_reach.py::"
            "test_no_watch_tells_the_command_of_the_hosts_activity",)),
    Mutant("proxy-private-range-forgotten", "stockade/net/addresses.py",
           '    ("10.0.0.0/8", "private"),\n', "",
           ("tests/test_proxy_rules.py::test_forbidden_addresses",)),
    Mutant("proxy-loopback-forgotten", "stockade/net/addresses.py",
           '    ("127.0.0.0/8", "loopback"),\n', "",
           ("tests/test_proxy_rules.py::test_forbidden_addresses",
            "tests/test_proxy_rules.py::test_embedded_ipv4_forms_are_judged_by_their_ipv4")),
    Mutant("environment-inherits-host", "stockade/launch/env.py",
           "    env: dict[str, str] = {}", "    env: dict[str, str] = dict(host)",
           ("tests/test_linux_process.py::test_parent_environment_secrets_do_not_reach_the_child",)),
    Mutant("read-roots-mounted-writable", "stockade/linux/mnt.py",
           "RO = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV",
           "RO = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV",
           ("tests/test_linux_fs.py::test_write_to_read_root_fails",
            "tests/test_probe.py::test_the_attestation_field_by_field")),
    Mutant("write-roots-not-nosuid", "stockade/linux/mnt.py",
           "    return MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (0 if exec_from_write",
           "    return MOUNT_ATTR_NODEV | (0 if exec_from_write",
           ("tests/test_helpers_boundary.py::test_every_mount_of_the_view_is_nosuid_and_nodev",)),
    Mutant("seccomp-tiocsti-allowed", "stockade/linux/seccomp.py",
           "              for request in (_TIOCSTI, _TIOCLINUX)]",
           "              for request in (_TIOCLINUX,)]",
           ("tests/test_linux_process.py::test_tiocsti_is_denied",
            "tests/test_linux_layers.py::test_seccomp_denies_terminal_injection")),
    Mutant("seccomp-clone-namespaces-allowed", "stockade/linux/seccomp.py",
           "    rules += [(\"clone\", errno.EPERM, (masked(0, flag, flag),)) for flag in "
           "_CLONE_NEW_FLAGS]\n", "",
           ("tests/test_linux_layers.py::test_seccomp_blocks_new_namespaces",)),
    Mutant("host-sockets-under-slash-unmasked", "stockade/linux/hostsockets.py",
           '    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")',
           '    return path == root or path.startswith(root + "/")',
           ("tests/test_unix_socket_roots.py::test_read_everything_leaves_no_host_socket_reachable",)),
    Mutant("host-socket-masked-by-its-listed-name", "stockade/linux/hostsockets.py",
           "        path = real(listed)\n", "        path = listed if real(listed) else None\n",
           ("tests/test_unix_socket_roots.py::"
            "test_a_host_socket_bound_through_a_symbolic_link_is_masked_where_it_lies",)),
    Mutant("write-root-walk-recursive", "stockade/linux/protect.py",
           "in _walk(root, root_fd):", 'in os.fwalk(".", dir_fd=root_fd):',
           ("tests/test_workspace_walk.py::"
            "test_a_tree_1500_deep_breaks_no_later_launch_and_its_depths_stay_protected",)),
    Mutant("captured-output-uncapped", "stockade/launch/manager.py",
           "    limit = request.limits.output if request.limits.output is not None else "
           "DEFAULT_OUTPUT_LIMIT",
           "    limit = DEFAULT_OUTPUT_LIMIT",
           ("tests/test_linux_process.py::test_output_is_bounded_and_flagged",)),
    Mutant("deny-default-opasswd-dropped", "stockade/policy/presets.py",
           '"/etc/ssl/private", "/etc/security/opasswd",', '"/etc/ssl/private",',
           ("tests/test_helpers_boundary.py::"
            "test_default_denies_cover_credential_backups_and_private_keys",)),
    Mutant("protected-mcp-json-dropped", "stockade/policy/model.py",
           '    ".mcp.json", ".vscode",', '    ".vscode",',
           ("tests/test_linux_fs.py::"
            "test_files_that_make_host_tools_run_code_are_read_only_by_default",)),
    Mutant("planted-link-to-write-root-followed", "stockade/launch/compile.py",
           "            holder = holding_root(link, roots)\n            if holder is not None:",
           "            holder = holding_root(link, roots)\n            if holder is None:",
           ("tests/test_helpers_boundary.py::"
            "test_a_write_root_reached_through_a_planted_link_is_refused",)),
    Mutant("proxy-portless-deny-narrowed", "stockade/net/rules.py",
           "            if rule.matches_host(host) and rule.port in (None, port):",
           "            if rule.matches_host(host) and rule.port == port:",
           ("tests/test_proxy_rules.py::test_deny_is_checked_before_allow_and_covers_every_port",)),
    Mutant("change-store-follows-links", "stockade/lifecycle/changes.py",
           "        info = os.lstat(path)\n    except OSError as exc:\n        raise ChangesError("
           "\"changes_untrusted\"",
           "        info = os.stat(path)\n    except OSError as exc:\n        raise ChangesError("
           "\"changes_untrusted\"",
           (STORE + "test_a_store_others_could_write_is_refused[link]",)),
    # the Windows Sandbox driver (docs/windows-sandbox.md): the guest, its agent, the daemon
    Mutant("wsb-guest-accepts-any-peer", "stockade/vm/wsb_guest.py",
           "        if peer[0] == host:\n            return conn",
           "        if True:\n            return conn",
           (WSB + "test_the_guest_accepts_only_the_host_address",)),
    Mutant("wsb-read-only-mapping-lost", "stockade/vm/wsb_config.py",
           '"true" if mapping.read_only else "false"', '"false"',
           (WSB + "test_the_configuration_read_back_field_by_field",)),
    Mutant("wsb-none-keeps-a-network", "stockade/vm/wsb_config.py",
           '"Enable" if plan.networking else "Disable"', '"Enable"',
           (WSB + "test_the_configuration_read_back_field_by_field",)),
    Mutant("wsb-firewall-rules-without-a-network", "stockade/vm/wsb_bootstrap.py",
           "    if not plan.networking:\n        return []\n", "",
           (WSB + "test_a_guest_without_a_network_checks_it_has_none_and_allows_nothing",)),
    Mutant("wsb-command-user-may-be-an-administrator", "stockade/vm/wsb_bootstrap.py",
           'PRIVILEGED_GROUPS = ("S-1-5-32-544", ', "PRIVILEGED_GROUPS = (",
           (WSB + "test_the_command_user_is_standard_and_verified_before_the_agent",)),
    Mutant("wsb-channel-other-than-the-plans", "stockade/vm/wsb.py",
           "    if (record.transport == rz.TCP) != networking:", "    if False:",
           (WSB + "test_a_channel_other_than_the_plans_is_refused",)),
    Mutant("wsb-proxy-serves-any-peer", "stockade/vm/wsb.py",
           "            if peer[0] == self.guest:", "            if True:",
           (WSB + "test_the_proxys_listener_hands_on_only_the_guests_connections",)),
    Mutant("wsb-proxy-on-loopback", "stockade/vm/wsb.py",
           "if ipaddress.IPv4Address(record.host).is_loopback:", "if False:",
           (WSB + "test_the_proxy_is_never_served_on_a_loopback_address",)),
    Mutant("wsb-rendezvous-proof-without-the-host", "stockade/vm/wsb_rendezvous.py",
           'text = f"{boot}\\0{transport}\\0{address}\\0{port}\\0{host}".encode()',
           'text = f"{boot}\\0{transport}\\0{address}\\0{port}\\0".encode()',
           (WSB + "test_a_ready_record_round_trips_and_verifies",)),
    Mutant("wsb-zombie-counted-gone", "stockade/vm/wsb.py",
           "            self._gone = self.process.poll() is not None",
           "            self._gone = True",
           (WSB_DAEMON + "test_a_windowssandbox_process_that_will_not_end_is_a_zombie_until_it"
            "_does",)),
    # (the checks both guest agents share: stockade/session/serving.py)
    Mutant("agent-wrong-secret-accepted", "stockade/session/serving.py",
           "if not hmac.compare_digest(bytes.fromhex(message.body[\"nonce\"]), self.nonce):",
           "if False:",
           (WSB_AGENT + "test_violations_end_the_session_with_a_typed_error",)),
    Mutant("wsb-agent-keep-detached-ignored", "stockade/vm/wsb_agent.py",
           'if hello.get("keep_detached"):', "if False:",
           (WSB_AGENT + "test_violations_end_the_session_with_a_typed_error",)),
    Mutant("agent-timeout-not-enforced", "stockade/session/serving.py",
           "            command.timed_out = True\n            command.kill()",
           "            command.timed_out = True",
           (WSB_AGENT + "test_a_timeout_ends_the_command_and_everything_it_started",)),
    Mutant("wsb-agent-output-unbounded", "stockade/vm/wsb_agent.py",
           "lambda: self._output < OUTPUT_HIGH or self._broken", "lambda: True or self._broken",
           (WSB_AGENT + "test_the_outbox_holds_output_readers_past_the_high_mark",)),
    Mutant("agent-stdin-window-unchecked", "stockade/session/serving.py",
           "        if command.outstanding > protocol.STDIN_WINDOW:\n            raise",
           "        if False:\n            raise",
           (WSB_AGENT + "test_violations_end_the_session_with_a_typed_error",)),
    Mutant("wsb-daemon-retries-unbounded", "stockade/vm/wsb_daemon.py",
           "        for _ in range(attempts):", "        for _ in range(attempts + 1):",
           (WSB_DAEMON + "test_after_every_attempt_failed_boots_cool_down",)),
    Mutant("wsb-daemon-no-cooldown", "stockade/vm/wsb_daemon.py",
           "if self._cooldown_until is not None and self._clock() < self._cooldown_until:",
           "if False:",
           (WSB_DAEMON + "test_after_every_attempt_failed_boots_cool_down",)),
    Mutant("wsb-daemon-boots-beside-a-zombie", "stockade/vm/wsb_daemon.py",
           "            if not self._clean():", "            if not self._clean() and False:",
           (WSB_DAEMON + "test_while_a_zombie_remains_no_guest_is_booted",)),
    Mutant("wsb-daemon-reuses-another-shape", "stockade/vm/wsb_daemon.py",
           "idle.shape == wanted and idle.alive()", "idle.alive()",
           (WSB_DAEMON + "test_another_shape_stops_the_idle_guest_and_boots_its_own",)),
    Mutant("wsb-daemon-keeps-a-killed-guest", "stockade/vm/wsb_daemon.py",
           "keep = reuse and not self._closed.is_set() and guest.alive()",
           "keep = not self._closed.is_set() and guest.alive()",
           (WSB_DAEMON + "test_a_guest_not_handed_back_for_reuse_or_ended_is_stopped",)),
    Mutant("wsb-daemon-never-idle", "stockade/vm/wsb_daemon.py",
           "if guest is None or self._clock() - self._last_used < self.idle:",
           "if True:",
           (WSB_DAEMON + "test_an_idle_guest_is_torn_down_after_the_idle_timeout",)),
    # a guest left by a process killed without its exit handlers (issue 36): ledgered before
    # its boot is waited for, ended by a reconcile, the very process recorded only; the
    # `windows_sandbox` row of the Windows report from the driver's own checks, typed
    Mutant("wsb-guest-not-ledgered", "stockade/vm/wsb.py",
           "                record.add(wsb_ledger.KIND, self.plan.boot_id,\n",
           "                (lambda *unrecorded: None)(wsb_ledger.KIND, self.plan.boot_id,\n",
           (WSB_LEDGER + "test_a_guest_whose_process_was_killed_is_ended_by_the_next_reconcile",)),
    Mutant("wsb-guest-of-the-tool-not-ledgered", "stockade/vm/wsb.py",
           "                record.add(wsb_ledger.KIND, self.plan.boot_id, wsb_ledger.BY_ID)\n",
           "                pass\n",
           (WSB_LEDGER + "test_a_guest_of_the_wsb_tool_is_recorded_before_it_starts",)),
    Mutant("wsb-guest-ended-by-its-id-alone", "stockade/windows/procid.py",
           "        if _created(handle) != created or not _active(handle):\n",
           "        if not _active(handle):\n",
           (WSB_LEDGER + "test_a_process_that_took_the_guests_id_is_never_ended",
            PROCID + "test_a_process_that_took_the_id_is_not_the_recorded_one")),
    Mutant("wsb-guest-forgotten-while-it-runs", "stockade/vm/wsb_ledger.py",
           '        if not procid.end(detail["pid"], detail["created"]):',
           '        if not procid.end(detail["pid"], detail["created"]) and False:',
           (WSB_LEDGER + "test_a_windowssandbox_that_will_not_end_keeps_its_record",)),
    Mutant("wsb-guest-of-the-tool-stop-unchecked", "stockade/vm/wsb_ledger.py",
           "    if _listed(launcher, guid):\n", "    if False:\n",
           (WSB_LEDGER + "test_a_guest_of_the_wsb_tool_that_cannot_be_seen_stopped_keeps_its"
            "_record[stop-ignored]",)),
    Mutant("windows-sandbox-row-unprobed", "stockade/launch/report.py",
           "        backend.probe()\n", "        pass\n",
           (WINDOWS_PROBE + "test_the_windows_sandbox_row_is_unavailable_typed_without_the"
            "_feature",)),
    Mutant("windows-sandbox-row-untyped", "stockade/launch/report.py",
           'return Row(name, UNAVAILABLE, mechanism, f"{exc.code}: {exc.message}")',
           "return Row(name, UNAVAILABLE, mechanism, exc.message)",
           (WINDOWS_PROBE + "test_the_windows_sandbox_row_is_unavailable_typed_without_the"
            "_feature",)),
    Mutant("windows-sandbox-row-missing", "stockade/windows/report.py",
           '        driver_row("windows_sandbox", registry.entry(WINDOWS_SANDBOX)),\n', "",
           (WINDOWS_PROBE + "test_the_report_marks_each_capability_from_the_attestation",
            "tests/test_windows_import.py::test_the_report_lists_the_network_broker_and"
            "_windows_sandbox_rows_as_on_windows")),
    Mutant("posix-agent-enters-a-drive-path", "stockade/session/child.py",
           '        if not cwd.startswith("/"):', "        if False:",
           ("tests/test_session_protocol.py::"
            "test_the_posix_agent_refuses_a_windows_drive_path_as_cwd",)),
    Mutant("vm-guest-memfds-allowed", "stockade/vm/machine.py",
           '    memfds = b"" if exec_from_write else seccomp.compile_rules(',
           '    memfds = b"" if True else seccomp.compile_rules(',
           ("tests/test_vm_qemu.py::"
            "test_written_memory_is_not_executed_without_exec_from_write",)),
    Mutant("host-code-not-found", "stockade/launch/compile.py",
           "    host_code, host_code_kinds, host_unmade = _host_code(ctx, write, deny)\n",
           "    host_code, host_code_kinds, host_unmade = (), (), set()\n",
           (HOST + "test_the_venv_stockade_runs_from_is_read_only_and_immovable_in_the_sandbox",
            HOST + "test_the_landlock_tier_refuses_a_workspace_holding_the_host_code")),
    Mutant("host-code-not-mounted", "stockade/linux/mnt.py",
           "readonly=request.host_code + request.home_code, denied=linked,\n",
           "readonly=request.home_code, denied=linked,\n",
           (HOST + "test_the_venv_stockade_runs_from_is_read_only_and_immovable_in_the_sandbox",)),
    Mutant("host-code-pth-entries-unread", "stockade/launch/hostcode.py",
           '    found += [Place(entry, "pth_entry") for entry in _pth_entries(\n',
           '    found += [Place(entry, "pth_entry") for entry in () if _pth_entries(\n',
           (HOST + "test_a_missing_directory_a_pth_file_names_in_the_workspace_is_refused",)),
    Mutant("host-code-hidden-pth-unread", "stockade/launch/hostcode.py",
           'if entry.name.endswith(".pth")):',
           'if entry.name.endswith(".pth") and entry.name[0] != "."):',
           (HOST + "test_a_missing_directory_a_pth_file_names_in_the_workspace_is_refused"
            "[.atk.pth]",)),
    # --- issue 29 H1: no run reaches another workspace's private home ------------------
    Mutant("homes-unmasked", "stockade/launch/compile.py",
           '        masked.append((ctx.key_dir + homes.SUFFIX, "the sandboxes\' private homes"))',
           "        pass",
           ("tests/test_linux_home.py::test_a_run_never_reaches_another_workspaces_private_home",
            "tests/test_linux_home.py::"
            "test_a_run_naming_another_state_directory_keeps_its_home_out_of_others_reach",
            "tests/test_vm_qemu.py::test_a_guest_never_reaches_another_workspaces_private_home")),
    # --- issue 29 H2: the homes' place does not follow the launch's environment ------------
    Mutant("homes-follow-the-state-directory", "stockade/launch/compile.py",
           "    home = homes.home_for(workspace, ctx.key_dir)\n",
           '    home = homes.home_for(workspace, ctx.host_env.get("STOCKADE_STATE_DIR", '
           "ctx.key_dir))\n",
           ("tests/test_linux_home.py::"
            "test_a_run_naming_another_state_directory_keeps_its_home_out_of_others_reach",)),
    Mutant("homes-own-home-not-granted-back", "stockade/linux/mnt.py",
           "    _regrant(top, own_devs, holders, regranted, request.exec_from_write, weaken)\n",
           "",
           ("tests/test_linux_home.py::test_a_run_never_reaches_another_workspaces_private_home",)),
    Mutant("home-record-unchecked", "stockade/lifecycle/homes.py",
           '    if not made and (_recorded(record) or "").partition("\\n")[0] + "\\n" != '
           '_identity(info):',
           "    if False:",
           ("tests/test_linux_home.py::test_a_private_home_stockade_did_not_make_is_remade",)),
    Mutant("host-code-link-followed", "stockade/launch/compile.py",
           "                if _below(name, write) and not covered(name):",
           "                if _below(name, write) and covered(name):",
           (HOST + "test_an_import_path_entry_reached_through_a_link_in_the_workspace_is_refused",
            )),
    # --- issue 29 A1, A2: the home as a write root ------------------------------------------
    Mutant("home-code-not-found", "stockade/launch/compile.py",
           "    home_code = homecode.keep(homecode.places(ctx.home, ctx.host_env), "
           "[g.path for g in write],\n                              homecode.homes(ctx.home))\n",
           "    home_code = homecode.HomeCode()\n",
           ("tests/test_home_code.py::test_the_home_code_is_not_the_commands_to_write",)),
    Mutant("home-code-link-remade", "stockade/launch/homecode.py",
           "            if inside:\n                found.watched.add(here)\n            if hops",
           "            if hops",
           ("tests/test_home_code.py::test_the_home_code_is_not_the_commands_to_write",)),
    Mutant("home-hidden-entries-not-whole", "stockade/launch/homecode.py",
           "    whole = [name for home in map(os.path.normpath, held) for name in _seen(home, "
           "roots, mounts)\n             if any(_within(name, root) for root in roots)]",
           "    whole = []",
           ("tests/test_home_code.py::"
            "test_no_hidden_entry_of_the_home_is_made_nor_any_directory_by_the_launch",)),
    Mutant("home-code-xdg-data-home-ignored", "stockade/policy/model.py",
           '(("XDG_CONFIG_HOME", ".config/"), ("XDG_DATA_HOME", ".local/share/"))',
           '(("XDG_CONFIG_HOME", ".config/"),)',
           ("tests/test_home_code.py::test_the_home_code_in_xdg_data_home_elsewhere_is_kept",)),
    Mutant("home-config-applied", "stockade/lifecycle/changes.py",
           "        home = [] if home_config else", "        home = [] if True else",
           (STORE + "test_a_home_workspace_lands_its_configuration_only_when_asked",)),
    # --- C1: the seal's key where no environment moves it, masked in every launch ------------
    Mutant("seal-key-beside-the-sets", "stockade/lifecycle/changes.py",
           "changeseal.verify(key_dir or changeseal.key_dir(), self.meta, bases)",
           "changeseal.verify(key_dir or os.path.dirname(os.path.dirname(self.path)), "
           "self.meta, bases)",
           (STORE + "test_a_state_directory_a_sandbox_built_whole_is_refused",
            STORE + "test_a_set_sealed_with_its_own_stores_key_is_refused")),
    Mutant("seal-key-place-unmasked", "stockade/lifecycle/statedir.py",
           "    if keys:\n        found.append(keys)\n", "",
           (MASKS + "test_the_seal_keys_place_is_masked_whatever_the_environment_says",)),
    Mutant("apply-writes-credential-stores", "stockade/lifecycle/changeapply.py",
           "        elif any(_at_or_below(change.path, n) for n in never):",
           "        elif False:",
           (STORE + "test_a_sealed_set_never_writes_credentials_or_start_up_files",)),
    # --- issue 29 L1: a home reached through a link is still the home to apply ------------------
    Mutant("apply-home-unresolved", "stockade/lifecycle/changeapply.py",
           "    resolved = os.path.realpath(path)\n",
           "    resolved = os.path.normpath(path)\n",
           (STORE + "test_a_home_reached_through_a_link_is_still_the_home[.psqlrc-changes_refused]",
            STORE + "test_a_home_reached_through_a_link_is_still_the_home"
            "[.config/htop/htoprc-changes_home_config]")),
    # --- issue 29 B1: the home and the state seen at a second path (a bind mount) -------------
    Mutant("home-code-alias-unseen", "stockade/launch/homecode.py",
           "    return list(dict.fromkeys([path, *(name for root in roots\n",
           "    return list(dict.fromkeys([path, *(name for root in ()\n",
           (ALIAS + "test_a_direct_run_through_a_bind_mount_keeps_the_home_code_and_the_state",)),
    Mutant("state-alias-unmasked", "stockade/launch/compile.py",
           "        names = list(dict.fromkeys([resolved, *(name for found in seen.values()\n",
           "        names = list(dict.fromkeys([resolved, *(name for found in ()\n",
           (ALIAS + "test_a_direct_run_through_a_bind_mount_keeps_the_home_code_and_the_state",)),
    Mutant("state-alias-root-admitted", "stockade/launch/compile.py",
           "        if inside(root.path, state) or aliases.within(state, root.path, mounts):",
           "        if inside(root.path, state):",
           (ALIAS + "test_a_root_inside_the_state_directory_under_another_path_is_refused",)),
    Mutant("apply-home-alias-unseen", "stockade/lifecycle/changeapply.py",
           "        name for root in roots for name in aliases.within(root, resolved, mounts)}",
           "        name for root in () for name in aliases.within(root, resolved, mounts)}",
           (ALIAS + "test_apply_knows_the_home_through_a_bind_mount",)),
    # --- issue 29, attack 7: a denied path under every name it has ----------------------------
    Mutant("deny-home-from-env-only", "stockade/launch/compile.py",
           "for home in (ctx.home, ctx.passwd_home)", "for home in (ctx.home,)",
           (DENIED + "test_the_password_databases_home_is_denied_whatever_home_says[namespaces]",
            DENIED + "test_a_missing_store_of_the_password_databases_home_in_a_write_root_is_"
            "refused")),
    Mutant("deny-alias-unmasked", "stockade/lifecycle/aliases.py",
           "                if name != place and held(name) and _same(name, place):",
           "                if False:",
           (DENIED + "test_a_denied_path_is_masked_at_every_name_a_bind_mount_gives_it"
            "[namespaces]",)),
    Mutant("deny-bound-part-unmasked", "stockade/lifecycle/aliases.py",
           "            elif at_or_below(m.top, inner) and held(m.point) \\\n",
           "            elif False and held(m.point) \\\n",
           (DENIED + "test_a_denied_path_is_masked_at_every_name_a_bind_mount_gives_it"
            "[namespaces]",)),
    Mutant("deny-alias-root-admitted", "stockade/launch/compile.py",
           "            hidden = holding_root(name, tuple(grants.values())) if name != root.path "
           "else None\n",
           "            hidden = None\n",
           (DENIED + "test_a_denied_path_is_masked_at_every_name_a_bind_mount_gives_it"
            "[namespaces]",)),
    Mutant("deny-default-wireguard-dropped", "stockade/policy/presets.py",
           '    "/etc/wireguard", "/etc/NetworkManager/system-connections",',
           '    "/etc/NetworkManager/system-connections",',
           (DENIED + "test_the_hosts_secrets_in_etc_are_denied_to_root[namespaces]",)),
    Mutant("apply-replaced-entry-conflicts", "stockade/lifecycle/changeapply.py",
           "        if change.kind == \"added\" and (change.root, change.rel) in replaced:\n"
           "            continue\n", "",
           (OVERLAY + "test_a_directory_replaced_by_a_file_and_back_is_applied_without_a_false_"
            "conflict",)),
    # --- issue 29 P1: reconcile prunes a home only when its workspace is plainly gone ----------
    Mutant("homes-pruned-on-any-error", "stockade/lifecycle/homes.py",
           "    except OSError:\n        return False\n    return False\n",
           "    except OSError:\n        return True\n    return False\n",
           ("tests/test_linux_home.py::"
            "test_reconcile_keeps_the_home_of_a_workspace_it_cannot_look_up",)),
    # --- issue 29: the sandbox ends whatever its pid 1 does ----------------------------------
    Mutant("pid1-outlives-its-parent", "stockade/linux/launcher.py",
           "            _die_with_parent()\n", "",
           (PROCESS + "test_the_sandbox_dies_with_its_owner_whatever_its_pid_1_does[api]",
            PROCESS + "test_the_sandbox_dies_with_its_owner_whatever_its_pid_1_does[cli]")),
    Mutant("pump-kills-once", "stockade/launch/pump.py",
           "            if clock.fired() or clock.over:\n                # The streams end",
           "            if clock.fired():\n                # The streams end",
           (PUMP + "test_the_kill_is_repeated_until_the_tree_ends_without_spinning",
            PROCESS + "test_the_timeout_and_cancel_end_a_sandbox_whose_pid_1_does_not_answer")),
    # --- issue 29 P1: the owner's reading of pid 1's status pipe ------------------------------
    Mutant("status-line-unchecked", "stockade/linux/backend.py",
           "        event = _event(line)\n", "        event = json.loads(line)\n",
           (STATUS + "test_lines_that_are_not_pid_1s_events_are_ignored_and_counted",)),
    Mutant("status-line-unbounded", "stockade/linux/backend.py",
           "            if len(self._tail) + len(line) > self.LINE_MAX:",
           "            if False:",
           (STATUS + "test_a_line_past_its_bound_is_dropped_whole_across_reads",)),
    Mutant("status-events-unbounded", "stockade/linux/backend.py",
           "        if event is None or not end and (len(self.events) >= self.EVENTS_MAX",
           "        if event is None or not end and (False",
           (STATUS + "test_a_flood_keeps_bounded_memory_and_time_and_the_end",)),
    # --- issue 31 (WINREAD 1): the sandbox's Job keeps its UI restrictions unless Windows
    # refuses to nest it; dropping them for any owner in a Job (a venv's python.exe is one)
    Mutant("windows-ui-limits-dropped-in-any-job", "stockade/windows/handle.py",
           "    try:\n        try:\n            return create(), plan\n",
           "    if nested:\n        plan = job.without_ui_limits(plan)\n"
           "        job.set_ui_restrictions(job_handle, plan)\n"
           "    try:\n        try:\n            return create(), plan\n",
           ("tests/test_windows_backend.py::"
            "test_an_owner_whose_job_lets_its_children_go_keeps_every_ui_limit[launcher]",)),
    # --- issue 36: the Windows egress fence (its service's decisions, records and plans) ------
    # who may ask: never a sandbox, never a process that is not the one that connected
    Mutant("fence-serves-an-appcontainer-caller", "stockade/windows/fence.py",
           "if caller.appcontainer or caller.restricted or caller.integrity",
           "if caller.restricted or caller.integrity",
           (FENCE + "test_a_caller_in_a_sandbox_or_no_longer_there_is_refused",
            FENCE + "test_a_sandboxed_caller_is_answered_nothing_but_a_refusal_and_cut_off")),
    Mutant("fence-serves-a-low-integrity-caller", "stockade/windows/fence.py",
           " or caller.integrity < MEDIUM_INTEGRITY:", ":",
           (FENCE + "test_a_caller_in_a_sandbox_or_no_longer_there_is_refused",)),
    Mutant("fence-trusts-a-reused-pid", "stockade/windows/fence.py",
           "if caller.created > accepted_at:", "if False:",
           (FENCE + "test_a_caller_in_a_sandbox_or_no_longer_there_is_refused",)),
    # for what: a Stockade launch of the caller's own, its SID read from its token
    Mutant("fence-target-any-appcontainer", "stockade/windows/fence.py",
           "if not (target.appcontainer and sids.is_appcontainer(target.package)):",
           "if not target.appcontainer:",
           (FENCE + "test_the_target_must_be_a_stockade_launch_of_the_callers_own",)),
    Mutant("fence-target-of-another-user", "stockade/windows/fence.py",
           "if target.user.upper() != caller.user.upper():", "if False:",
           (FENCE + "test_the_target_must_be_a_stockade_launch_of_the_callers_own",
            FENCE + "test_a_target_that_is_not_the_callers_launch_is_refused")),
    Mutant("fence-target-not-its-profiles", "stockade/windows/fence.py",
           "if not PROFILE_NAME.fullmatch(profile) or derived.upper() != target.package.upper():",
           "if not PROFILE_NAME.fullmatch(profile):",
           (FENCE + "test_the_target_must_be_a_stockade_launch_of_the_callers_own",)),
    Mutant("fence-target-older-than-its-caller", "stockade/windows/fence.py",
           "if target.created < caller.created:", "if False:",
           (FENCE + "test_the_target_must_be_a_stockade_launch_of_the_callers_own",)),
    Mutant("fence-twice-for-one-appcontainer", "stockade/windows/fence.py",
           "if sid.upper() in self._fenced:", "if False:",
           (FENCE + "test_one_appcontainer_is_fenced_once",)),
    # recorded before applied, taken back exactly, never from under a running sandbox
    Mutant("fence-filters-added-before-recorded", "stockade/windows/fence.py",
           '            record.add(FILTERS_KIND, removers.fresh_name("fence"), {"sid": sid,\n'
           '                                                                     "keys": list('
           'keys)})\n            self._firewall.add_filters(plan, keys)\n',
           '            self._firewall.add_filters(plan, keys)\n'
           '            record.add(FILTERS_KIND, removers.fresh_name("fence"), {"sid": sid,\n'
           '                                                                     "keys": list('
           'keys)})\n',
           (FENCE + "test_reconcile_after_a_crash_removes_what_was_recorded_and_only_that"
            "[after-the-filters]",)),
    Mutant("fence-exemption-set-before-recorded", "stockade/windows/fence.py",
           "                record.add(EXEMPTION_KIND, sid)\n"
           "                self._firewall.exempt(sid)\n",
           "                self._firewall.exempt(sid)\n"
           "                record.add(EXEMPTION_KIND, sid)\n",
           (FENCE + "test_reconcile_after_a_crash_removes_what_was_recorded_and_only_that"
            "[after-the-exemption]",)),
    Mutant("fence-filters-removed-under-a-running-sandbox", "stockade/windows/fence.py",
           'if firewall.running(detail["sid"]):', "if False:",
           (FENCE + "test_filters_stay_while_a_process_of_the_appcontainer_runs",)),
    Mutant("fence-record-of-a-users-sid-accepted", "stockade/windows/fence.py",
           'and sids.is_appcontainer(detail["sid"])):', "):",
           (FENCE + "test_records_the_fence_could_not_act_on_safely_are_refused",)),
    Mutant("fence-exemption-record-of-any-sid", "stockade/windows/fence.py",
           "if not sids.is_appcontainer(name) or detail:", "if detail:",
           (FENCE + "test_records_the_fence_could_not_act_on_safely_are_refused",)),
    Mutant("fence-another-providers-filter-deleted", "stockade/windows/wfpengine.py",
           "        if not ours:\n", "        if False:\n",
           (FENCE + "test_only_stockades_filters_are_deleted",)),
    Mutant("fence-exemption-list-overwritten", "stockade/windows/wfpengine.py",
           "self._set_exemptions([*listed, sid])", "self._set_exemptions([sid])",
           (FENCE + "test_the_exemption_list_changes_by_one_sid_keeping_the_rest",)),
    Mutant("fence-exemption-list-cleared", "stockade/windows/wfpengine.py",
           "kept = [one for one in listed if one.upper() != sid.upper()]", "kept = []",
           (FENCE + "test_the_exemption_list_changes_by_one_sid_keeping_the_rest",)),
    # the plans: allowlist leaves the proxy's port alone, any the guard's ranges refused
    Mutant("fence-allowlist-any-loopback-port", "stockade/windows/wfp.py",
           '        Filter(v4, (_package(sid), Condition("IP_REMOTE_PORT", "not_equal", port)),\n'
           '               "not_the_proxy_port"),\n', "",
           (WFP + "test_the_allowlist_plan_leaves_the_proxy_alone_and_nothing_else",)),
    Mutant("fence-allowlist-ipv6-open", "stockade/windows/wfp.py",
           '        Filter("ALE_AUTH_CONNECT_V6", (_package(sid),), "ipv6"),\n', "",
           (WFP + "test_the_allowlist_plan_leaves_the_proxy_alone_and_nothing_else",)),
    Mutant("fence-any-without-the-guards-ranges", "stockade/windows/wfp.py",
           "for network, kind in addresses.guarded_networks():",
           "for network, kind in addresses.guarded_networks()[:0]:",
           (WFP + "test_the_any_plan_refuses_every_range_of_the_guard_and_the_host",)),
    Mutant("fence-any-reaches-the-host", "stockade/windows/wfp.py",
           'for layer in ("ALE_AUTH_CONNECT_V4", "ALE_AUTH_CONNECT_V6")]',
           'for layer in ()]',
           (WFP + "test_the_any_plan_refuses_every_range_of_the_guard_and_the_host",)),
    Mutant("fence-allowlist-with-a-network-capability", "stockade/windows/netfence.py",
           'if request.network.mode == "any" else ()',
           'if request.network.mode in ("any", "allowlist") else ()',
           (FENCE + "test_an_allowlist_launch_gets_the_hosts_proxy_and_is_fenced_to_its_port",
            BROKER + "test_the_network_capability_is_granted_from_the_request_for_any_alone")),
    # the protocol: versioned, closed, bounded
    Mutant("fence-protocol-unknown-field-accepted", "stockade/windows/fenceproto.py",
           "    if extra or missing:\n", "    if missing:\n",
           (FENCE + "test_a_request_this_version_does_not_define_exactly_is_refused",)),
    Mutant("fence-protocol-any-version", "stockade/windows/fenceproto.py",
           'if body.get("v") != VERSION or type(body.get("v")) is not int:', "if False:",
           (FENCE + "test_a_request_this_version_does_not_define_exactly_is_refused",)),
    Mutant("fence-protocol-frame-unbounded", "stockade/windows/fenceproto.py",
           "    if size > MAX_FRAME:\n", "    if False:\n",
           (FENCE + "test_an_oversized_frame_is_refused_from_its_header_and_never_sent",)),
    Mutant("fence-protocol-key-twice", "stockade/windows/fenceproto.py",
           "        if len(body) != len(pairs):\n", "        if False:\n",
           (FENCE + "test_a_frame_that_is_not_one_json_object_is_refused",)),
    Mutant("fence-connection-survives-a-bad-frame", "stockade/windows/fence.py",
           "        except fenceproto.ProtocolError as exc:\n            self.open = False\n",
           "        except fenceproto.ProtocolError as exc:\n",
           (FENCE + "test_a_frame_the_protocol_refuses_ends_the_connection_and_its_fence",)),
    # the pipe: SYSTEM's (clients check), no instance others may serve, no AppContainer
    Mutant("fence-client-trusts-any-pipe", "stockade/windows/fencepipe.py",
           "    if owner_sid.upper() != sids.SYSTEM:\n", "    if False:\n",
           (FENCE + "test_only_a_pipe_localsystem_owns_is_the_services",)),
    Mutant("fence-pipe-writable-as-a-server", "stockade/windows/fencepipe.py",
           "(A;;0x120083;;;AU)", "(A;;GRGW;;;AU)",
           (FENCE + "test_the_pipe_is_systems_open_to_users_for_data_only_and_to_no_"
            "appcontainer",)),
    # what the backend accepts, and what the service may run as LocalSystem
    Mutant("fence-allowlist-accepted-without-the-service", "stockade/windows/netfence.py",
           "    if why:\n        raise UnenforceableError", "    if False:\n        raise "
           "UnenforceableError",
           (FENCE + "test_allowlist_and_any_are_refused_without_the_service_naming_how_to_"
            "install_it",)),
    Mutant("fence-reach-accepted", "stockade/windows/netfence.py",
           "    if network.reach:\n", "    if False:\n",
           (FENCE + "test_what_the_windows_fence_does_not_offer_is_refused",)),
    Mutant("fence-installed-from-a-venv", "stockade/windows/fenceinstall.py",
           'if ntpath.normcase(prefix.rstrip("\\\\")) != ntpath.normcase(base_prefix.rstrip('
           '"\\\\")):', "if False:",
           (FENCE + "test_a_virtual_environment_is_refused",)),
    Mutant("fence-installed-over-others-writers", "stockade/windows/fenceinstall.py",
           "                and ace.sid.upper() not in TRUSTED:", "                and False:",
           (FENCE + "test_an_interpreter_below_the_drives_root_is_refused_as_others_can_"
            "change_it",)),
    Mutant("fence-installed-over-a-users-file", "stockade/windows/fenceinstall.py",
           "    if owner.upper() not in TRUSTED:\n", "    if False:\n",
           (FENCE + "test_a_file_the_user_owns_in_the_interpreter_is_refused",)),
    Mutant("fence-installed-below-a-renamable-directory", "stockade/windows/fenceinstall.py",
           "for path in ancestors(interpreter):", "for path in ancestors(interpreter)[:0]:",
           (FENCE + "test_a_directory_above_that_lets_another_rename_the_interpreter_is_refused",)),
    # --- issue 36, item 3: the one-shot Windows broker launches only what its manifest, bound
    # to its PID, its nonce and the digest it recomputes, authorizes; the manifest is closed,
    # consumed once and must be the file the host wrote
    Mutant("broker-frame-unknown-field-accepted", "stockade/windows/manifest.py",
           "    if unknown:\n", "    if False:\n",
           (BROKER + "test_every_frame_refuses_an_unknown_field_an_unknown_version_and_its_"
            "oversize",)),
    Mutant("broker-frame-version-unchecked", "stockade/windows/manifest.py",
           'if type(body.get("version")) is not int or body["version"] != VERSION:',
           "if False:",
           (BROKER + "test_every_frame_refuses_an_unknown_field_an_unknown_version_and_its_"
            "oversize",)),
    Mutant("broker-frame-unbounded", "stockade/windows/manifest.py",
           "    if len(data) > limit:\n", "    if False:\n",
           (BROKER + "test_every_frame_refuses_an_unknown_field_an_unknown_version_and_its_"
            "oversize",)),
    Mutant("broker-context-any-desktop", "stockade/windows/manifest.py",
           "isinstance(v, str) and desktop.is_launch_desktop(v)", "isinstance(v, str)",
           (BROKER + "test_a_manifest_that_is_not_one_is_refused_typed",)),
    Mutant("broker-context-any-capability", "stockade/windows/manifest.py",
           "isinstance(s, str) and standing.is_capability(s) for s in v", "isinstance(s, str) "
           "for s in v", (BROKER + "test_a_manifest_that_is_not_one_is_refused_typed",)),
    Mutant("broker-manifest-open-to-every-appcontainer", "stockade/windows/manifestfile.py",
           "return Dacl((Ace.allow(user_sid, c.FILE_ALL_ACCESS),), protected=True",
           'return Dacl((Ace.allow(user_sid, c.FILE_ALL_ACCESS), Ace.allow("S-1-15-2-1", '
           "c.FILE_ALL_ACCESS)), protected=True",
           (BROKER + "test_a_sandbox_could_not_open_the_manifest",)),
    Mutant("broker-manifest-written-over-a-name", "stockade/windows/manifestfile.py",
           "ctypes.byref(attributes), c.CREATE_NEW,", "ctypes.byref(attributes), 2,",
           (BROKER + "test_a_name_someone_took_first_fails_the_write",)),
    Mutant("broker-manifest-opened-through-a-link", "stockade/windows/manifestfile.py",
           "                                 c.OPEN_EXISTING,\n"
           "                                 c.FILE_FLAG_OPEN_REPARSE_POINT | "
           "c.FILE_FLAG_DELETE_ON_CLOSE,",
           "                                 c.OPEN_EXISTING,\n"
           "                                 c.FILE_FLAG_DELETE_ON_CLOSE,",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused[symlink]",)),
    Mutant("broker-manifest-opened-shared", "stockade/windows/manifestfile.py",
           "c.GENERIC_READ | c.DELETE, 0, None,\n"
           "                                 c.OPEN_EXISTING,\n",
           "c.GENERIC_READ | c.DELETE, 7, None,\n"
           "                                 c.OPEN_EXISTING,\n",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused[held-open]",)),
    Mutant("broker-manifest-kept-after-consume", "stockade/windows/manifestfile.py",
           "                                 c.OPEN_EXISTING,\n"
           "                                 c.FILE_FLAG_OPEN_REPARSE_POINT | "
           "c.FILE_FLAG_DELETE_ON_CLOSE,",
           "                                 c.OPEN_EXISTING,\n"
           "                                 c.FILE_FLAG_OPEN_REPARSE_POINT,",
           (BROKER + "test_the_manifest_is_closed_from_its_creation_and_consumed_once",)),
    Mutant("broker-manifest-any-file-at-the-name", "stockade/windows/manifestfile.py",
           "    if file_id is not None and facts.file_id != file_id:\n", "    if False:\n",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused"
            "[another-file]",)),
    Mutant("broker-manifest-links-unchecked", "stockade/windows/manifestfile.py",
           "    if facts.links != 1:\n", "    if False:\n",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused"
            "[hard-link]",)),
    Mutant("broker-manifest-reparse-point-read", "stockade/windows/manifestfile.py",
           "    if facts.attributes & (c.FILE_ATTRIBUTE_DIRECTORY | "
           "c.FILE_ATTRIBUTE_REPARSE_POINT):\n", "    if False:\n",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused[symlink]",)),
    Mutant("broker-manifest-dacl-unchecked", "stockade/windows/manifestfile.py",
           "    if not dacl.protected or dacl.aces != closed_dacl(user_sid).aces:\n",
           "    if False:\n",
           (BROKER + "test_a_manifest_replaced_between_write_and_consume_is_refused"
            "[dacl-widened]",)),
    Mutant("broker-manifest-read-unbounded", "stockade/windows/manifestfile.py",
           "        if len(data) > limit:\n", "        if False:\n",
           (BROKER + "test_the_manifest_is_read_only_up_to_its_bound",)),
    # a manifest a dead host left (issue 36): ledgered before it is written, removed by a
    # reconcile only once its broker (that very process) has ended, never through a link, and
    # only when it is what a host writes
    Mutant("broker-manifest-not-ledgered", "stockade/windows/brokered.py",
           "        record.add(manifestfile.KIND, path,",
           "        (lambda *unrecorded: None)(manifestfile.KIND, path,",
           (BROKER + "test_a_manifest_a_dead_host_left_is_removed_by_the_next_reconcile",
            BROKER + "test_the_manifest_is_recorded_before_it_is_written")),
    Mutant("left-manifest-removed-while-its-broker-runs", "stockade/windows/manifestfile.py",
           "    if procid.running(broker, created):\n", "    if False:\n",
           (BROKER + "test_a_left_manifest_stays_while_its_broker_runs",)),
    Mutant("left-manifest-broker-asked-after-when-gone", "stockade/windows/manifestfile.py",
           "    if not _present(api, path):\n", "    if False:\n",
           (BROKER + "test_a_launch_settles_without_asking_after_its_ended_broker",)),
    Mutant("left-manifest-broker-known-by-its-id-alone", "stockade/windows/procid.py",
           "        return _created(handle) == created and _active(handle)\n",
           "        return _active(handle)\n",
           (BROKER + "test_a_process_that_took_the_brokers_id_does_not_keep_its_manifest",
            PROCID + "test_a_process_that_took_the_id_is_not_the_recorded_one")),
    Mutant("left-manifest-removed-through-a-link", "stockade/windows/manifestfile.py",
           "c.OPEN_EXISTING, c.FILE_FLAG_OPEN_REPARSE_POINT, None)",
           "c.OPEN_EXISTING, 0, None)",
           (BROKER + "test_only_what_a_host_writes_is_removed[symlink]",)),
    Mutant("left-manifest-opened-shared", "stockade/windows/manifestfile.py",
           "c.GENERIC_READ | c.DELETE, 0, None,\n"
           "                                 c.OPEN_EXISTING, c.",
           "c.GENERIC_READ | c.DELETE, 7, None,\n"
           "                                 c.OPEN_EXISTING, c.",
           (BROKER + "test_only_what_a_host_writes_is_removed[held-open]",)),
    Mutant("left-manifest-unproven-removed", "stockade/windows/manifestfile.py",
           "        if why:\n            raise RemovalError(",
           "        if False:\n            raise RemovalError(",
           (BROKER + "test_only_what_a_host_writes_is_removed[another-file]",
            BROKER + "test_only_what_a_host_writes_is_removed[not-a-manifest]")),
    Mutant("left-manifest-of-another-broker-removed", "stockade/windows/manifestfile.py",
           "    return None if bound == broker else", "    return None if True else",
           (BROKER + "test_only_what_a_host_writes_is_removed[another-brokers]",)),
    Mutant("broker-reused", "stockade/windows/broker.py",
           "        if self._spent:\n", "        if False:\n",
           (BROKER + "test_a_broker_takes_one_manifest_whatever_became_of_it",)),
    Mutant("broker-pid-unbound", "stockade/windows/broker.py",
           "        if manifest.broker_pid != self._pid:\n", "        if False:\n",
           (BROKER + "test_a_manifest_bound_to_another_process_is_refused",
            BROKER + "test_a_real_broker_process_launches_for_its_own_pid_only")),
    Mutant("broker-nonce-unchecked", "stockade/windows/broker.py",
           "        if not hmac.compare_digest(manifest.nonce, control.nonce):\n",
           "        if False:\n",
           (BROKER + "test_a_control_frame_with_another_nonce_is_refused",)),
    Mutant("broker-digest-taken-from-the-manifest", "stockade/windows/broker.py",
           "        recomputed = manifest.request.digest\n",
           "        recomputed = manifest.digest\n",
           (BROKER + "test_a_manifest_whose_request_is_not_the_digested_one_is_refused",)),
    Mutant("broker-manifest-digest-unchecked", "stockade/windows/broker.py",
           "        if not (hmac.compare_digest(recomputed, manifest.digest)\n",
           "        if not (True\n",
           (BROKER + "test_a_digest_rewritten_to_match_a_tampered_request_is_refused_by_the_"
            "hosts",)),
    Mutant("broker-hosts-digest-unchecked", "stockade/windows/broker.py",
           "                and hmac.compare_digest(recomputed, control.digest)):",
           "                and True):",
           (BROKER + "test_a_digest_rewritten_to_match_a_tampered_request_is_refused_by_the_"
            "hosts",)),
    Mutant("broker-mitigations-from-elsewhere", "stockade/windows/broker.py",
           "mitigations=process.mitigations(request.exec_from_write))",
           "mitigations=process.mitigations(True))",
           (BROKER + "test_the_broker_launches_exactly_what_the_canonical_request_says",)),
    Mutant("broker-job-handle-full-access", "stockade/windows/job.py",
           "ctypes.byref(copy), c.JOB_OBJECT_ASSIGN_PROCESS, True, 0)",
           "ctypes.byref(copy), 0, True, c.DUPLICATE_SAME_ACCESS)",
           (BROKER + "test_the_brokers_job_handle_may_only_put_a_process_in_the_job",)),
    Mutant("broker-inherits-the-owners-environment", "stockade/windows/brokered.py",
           'env={"SystemRoot": os.environ.get("SystemRoot", "C:\\\\Windows")})',
           "env=None)",
           (BROKER + "test_the_broker_process_is_isolated_and_inherits_only_its_handles",)),
    Mutant("broker-hung-broker-kept", "stockade/windows/brokered.py",
           "        if broker.poll() is None:", "        if False:",
           (BROKER + "test_a_broker_that_does_not_answer_is_ended_and_its_manifest_discarded"
            "[hangs]",)),
    Mutant("broker-unconsumed-manifest-left", "stockade/windows/brokered.py",
           "        left = written is not None and calls.discard(written.path)\n",
           "        left = False\n",
           (BROKER + "test_a_broker_that_does_not_answer_is_ended_and_its_manifest_discarded"
            "[crashes]",)),
    Mutant("probe-broker-taken-at-its-word", "stockade/windows/probe.py",
           '"launch_brokered": broker.get("creator") == broker.get("pid")',
           '"launch_brokered": broker.get("pid")',
           ("tests/test_windows_probe.py::"
            "test_a_fact_that_does_not_hold_fails_readiness_at_its_stage",)),
    Mutant("windows-child-of-anyone-resumed", "stockade/windows/handle.py",
           'or (None if broker["creator"] == broker["pid"] != os.getpid()',
           "or (None if True",
           ("tests/test_windows_truth.py::test_a_child_found_otherwise_than_launched_is_refused",)),
    # --- issue 30: what the C supervisor decides (its copy's programs are rebuilt) ----------
    # pid 1 makes no lookup in another process's /proc/<pid> for the caller (issue 29 P1):
    # neither on the way (caller_resolve) nor judging from the root alone (the check before P1)
    Mutant("proc-walk-unjudged", "stockade/linux/memwatch.c",
           "        if (another_process(tid, dir, name)) {\n            close(dir);\n"
           "            errno = EACCES;\n            return -1;\n        }\n", "",
           (CREATE + "test_pid_1s_own_descriptors_are_not_reached_through_proc",)),
    Mutant("proc-lookup-judged-at-the-root-only", "stockade/linux/memwatch.c",
           "    int top = top_directory(dir);", "    int top = -1;",
           (CREATE + "test_pid_1s_own_descriptors_are_not_reached_from_inside_proc_1",)),
    # exec_from_write = false against written memory: the exec watch and the memfd seal, each
    # the only layer left in its test
    Mutant("exec-watch-runs-nameless-files", "stockade/linux/memwatch.c",
           "    return bad || !S_ISREG(info.stx_mode) || info.stx_nlink == 0\n",
           "    return bad || !S_ISREG(info.stx_mode)\n",
           (MEMFD + "test_each_layer_holds_alone[exec_watch]",)),
    Mutant("memfd-made-unsealed", "stockade/linux/memwatch.c",
           "memfd_create(name, flags | MFD_NOEXEC_SEAL)", "memfd_create(name, flags)",
           (MEMFD + "test_each_layer_holds_alone[memfd_seal]",)),
    # protected names are not made in write roots: any case, not through a link pid 1 did not
    # follow itself, by no call the filter forgot
    Mutant("protected-names-case-sensitive", "stockade/linux/namewatch.c",
           "strcasecmp(n, p->last)", "strcmp(n, p->last)",
           (CREATE + "test_no_link_descriptor_or_moved_directory_makes_a_protected_name",)),
    Mutant("protected-open-follows-the-last-link", "stockade/linux/namewatch.c",
           "    int asked = (name ? flags & ~O_CREAT : flags) | (flags & O_EXCL ? 0 : O_NOFOLLOW);",
           "    int asked = name ? flags & ~O_CREAT : flags;",
           (CREATE + "test_no_link_descriptor_or_moved_directory_makes_a_protected_name",)),
    Mutant("name-watch-hidden-entry-unmatched", "stockade/linux/namewatch.c",
           '(strcmp(w->placed[i].name, ".*") == 0 ? hidden(p->last)',
           '(0 ? hidden(p->last)',
           ("tests/test_home_code.py::"
            "test_no_hidden_entry_of_the_home_is_made_nor_any_directory_by_the_launch",)),
    Mutant("name-watch-hidden-takes-dot-and-dot-dot", "stockade/linux/namewatch.c",
           "    return name[0] == '.' && strcmp(name, \".\") != 0 && strcmp(name, \"..\") != 0;",
           "    return name[0] == '.';",
           ("tests/test_home_code.py::test_the_home_code_is_not_the_commands_to_write",)),
    Mutant("name-watch-misses-renameat2", "stockade/linux/namewatch.c",
           "__NR_linkat, __NR_renameat2,", "__NR_linkat,",
           (CREATE + "test_the_shell_and_coreutils_cannot_make_a_protected_name[direct]",)),
    # pid 1 dies with what started it, whatever it does (the parent-death signal, kept)
    Mutant("pid1-parent-death-signal-cleared", "stockade/linux/supervisor.c",
           "    if ((flags & PLAN_UNBOUND) && prctl(PR_SET_PDEATHSIG, 0) != 0)",
           "    if (prctl(PR_SET_PDEATHSIG, 0) != 0)",
           (PROCESS + "test_the_sandbox_dies_with_its_owner_whatever_its_pid_1_does[api]",)),
    # the C relay cuts a tunnel whose peer stopped reading, as the Python one does
    Mutant("relay-stalled-peer-kept", "stockade/linux/relay.c",
           "                if (w->progress + idle_ms < deadline)\n"
           "                    deadline = w->progress + idle_ms;\n", "",
           ("tests/test_proxy.py::"
            "test_a_peer_that_stops_reading_is_cut_after_the_idle_timeout[compiled]",)),
    # a framework's read_only option (pydantic-ai) leaves nothing on the host writable
    Mutant("read-only-option-keeps-write-roots", "stockade/integrations/workspace.py",
           "                                              write=(), home=\"host\"))",
           "                                              write=fs.write, home=\"host\"))",
           ("tests/test_workspace.py::test_a_read_only_policy_writes_nothing_on_the_host",)),
    # a warm sandbox keeps nothing a command started unless its host opened it keep_detached,
    # and then only what left the command's session, and not past a timeout
    Mutant("session-keeps-detached-by-default", "stockade/session/agent.py",
           "        if not self.keep_detached:\n            return lambda session: False\n", "",
           ("tests/test_session.py::test_what_a_command_leaves_behind_is_killed_when_it_exits",
            KEEP + "test_without_it_a_command_cannot_keep_what_it_detached")),
    Mutant("session-keeps-what-left-only-its-group", "stockade/session/agent.py",
           "        return lambda session: session != own\n",
           "        return lambda session: True\n",
           (KEEP + "test_what_a_command_detached_runs_on_until_the_sandbox_closes",
            KEEP + "test_in_the_landlock_tier_too")),
    Mutant("session-stop-keeps-what-it-detached", "stockade/session/agent.py",
           "        if command.timed_out or command.cancelled:\n"
           "            return command.kept.__contains__\n", "",
           (KEEP + "test_a_timed_out_command_takes_what_it_detached_with_it",)),
    # a warm sandbox's command carries what pid 1 refused while it ran (issue 33 item 3), and
    # a memory violation counts that command's refusals only
    Mutant("session-drops-command-refusals", "stockade/session/sandbox.py",
           "        violations += network_denials(records) + refused\n",
           "        violations += network_denials(records)\n",
           ("tests/test_session_refusals.py::"
            "test_memory_refused_is_the_violation_of_the_command_that_asked",
            "tests/test_session_refusals.py::"
            "test_a_protected_name_not_made_is_the_violation_of_that_command")),
    Mutant("session-memory-refusals-counted-since-boot", "stockade/linux/backend.py",
           '            self._refused = memory[-1]["refused"]\n', "",
           (STATUS + "test_each_call_takes_the_refusals_that_came_since_the_last",)),
    Mutant("status-records-bounded-for-life", "stockade/linux/supervisor.c",
           "    if (b->used == 0 || now.tv_sec - b->since >= EVENT_WINDOW)\n",
           "    if (b->used == 0)\n",
           ("tests/test_session_refusals.py::"
            "test_past_the_bound_a_later_command_is_recorded_again",)),
    # attack 40: relative places from every base, whatever hook takes them; every path an
    # import finder holds; a module loaded by a relative path; ".." after a link
    Mutant("host-code-missing-relative-entry-skipped", "stockade/launch/hostcode.py",
           "              for path in _located(entry, bases)]",
           "              for path in _located(entry, bases)\n"
           "              if os.path.isabs(entry) or os.path.lexists(path)]",
           (HOST + "test_a_missing_relative_entry_a_hook_of_the_programs_own_takes_is_not_made[]",
            HOST + "test_a_relative_entry_a_hook_of_the_programs_own_takes_is_host_code")),
    Mutant("host-code-finder-path-attributes-unread", "stockade/launch/hostcode.py",
           "            items = [*value.keys(), *value.values()] if isinstance(value, dict)"
           " else [value]",
           "            items = [*value.keys(), *value.values()] if isinstance(value, dict)"
           " else []",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[str]",)),
    Mutant("host-code-finder-pathlike-unread", "stockade/launch/hostcode.py",
           "        path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None",
           "        path = value if isinstance(value, str) else None",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[path-table]",)),
    Mutant("host-code-finder-lists-unread", "stockade/launch/hostcode.py",
           "                paths = item if isinstance(item, (list, tuple, set, frozenset))"
           " else [item]",
           "                paths = [item]",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[path-list]",)),
    Mutant("host-code-finder-separator-taken-for-a-path", "stockade/launch/hostcode.py",
           "if path and os.path.isabs(path) and path != os.sep]",
           "if path and os.path.isabs(path)]",
           (HOST + "test_an_ordinary_project_venv_stays_writable",)),
    Mutant("host-code-finder-held-test-module-kept", "stockade/launch/hostcode.py",
           "        if path not in files:\n", "        if True:\n",
           (HOST + "test_a_test_module_pytest_holds_stays_the_commands",)),
    Mutant("host-code-relative-module-file-skipped", "stockade/launch/hostcode.py",
           "        if isinstance(path, str) and path:\n",
           "        if isinstance(path, str) and os.path.isabs(path):\n",
           (HOST + "test_a_module_loaded_by_a_relative_path_is_host_code",)),
    Mutant("host-code-relative-place-from-here-alone", "stockade/launch/hostcode.py",
           "    bases = [base for base in dict.fromkeys([here, started_in]) if base]",
           "    bases = [here] if here else []",
           (HOST + "test_a_relative_place_is_host_code_where_the_next_run_resolves_it[entry]",
            HOST + "test_a_relative_place_is_host_code_where_the_next_run_resolves_it"
            "[pycache-prefix]")),
    Mutant("host-code-cached-finder-path-unread", "stockade/launch/hostcode.py",
           "            found += _located(key, bases) + ([_at(path)] if",
           "            found += _located(key, bases) + ([] if",
           (HOST + "test_a_relative_place_is_host_code_where_the_next_run_resolves_it"
            "[cached-finder]",)),
    Mutant("host-code-dot-dot-collapsed", "stockade/launch/hostcode.py",
           '    if ".." not in parts:', "    if True:",
           (HOST + "test_a_directory_after_dot_dot_through_a_link_is_not_made[]",
            HOST + "test_a_directory_after_dot_dot_through_a_link_is_host_code")),
    Mutant("agent-sigchld-interrupts-calls", "stockade/session/agent.py",
           "        signal.siginterrupt(signal.SIGCHLD, False)\n", "",
           ("tests/test_session_keep_detached.py::"
            "test_a_child_exiting_fails_no_call_of_the_agent",)),
    # attack 41: a module's file by its spec's origin; modules below a working directory
    # that may hold the write root; every shape of path an import finder holds
    Mutant("host-code-module-origin-unread", "stockade/launch/hostcode.py",
           "            files = [located for located in named if os.path.isfile(located)]",
           "            files = []",
           (HOST + "test_a_module_whose_spec_names_its_file_only_as_its_origin_is_host_code"
            "[absolute]",)),
    Mutant("host-code-module-below-the-working-directory-skipped",
           "stockade/launch/hostcode.py",
           'if place.kind not in ("script", "start", "prefix", "cwd")]',
           'if place.kind not in ("script", "start", "prefix")]',
           (HOST + "test_a_module_below_a_working_directory_holding_the_workspace_is_host_code"
            "[]",)),
    Mutant("host-code-searched-below-the-working-directory-skipped",
           "stockade/launch/hostcode.py",
           'on_path = [place.path for place in found if place.kind == "import_path"]',
           'on_path = [place.path for place in found if place.kind in ("import_path", "cwd")]',
           (HOST + "test_a_directory_searched_below_a_working_directory_holding_the_workspace"
            "_is_host_code",)),
    Mutant("host-code-finder-slots-unread", "stockade/launch/hostcode.py",
           "    if not isinstance(finder, type):\n        for cls in",
           "    if False:\n        for cls in",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[slots]",)),
    Mutant("host-code-finder-sets-unread", "stockade/launch/hostcode.py",
           "(list, tuple, set, frozenset)", "(list, tuple)",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[set]",)),
    Mutant("host-code-finder-table-keys-unread", "stockade/launch/hostcode.py",
           "[*value.keys(), *value.values()]", "list(value.values())",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[keys]",)),
    Mutant("host-code-path-entry-finders-unread", "stockade/launch/hostcode.py",
           "(finder, False) for finder in list(sys.path_importer_cache.values())",
           "(finder, False) for finder in []",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[path-entry]",)),
    Mutant("host-code-path-entry-finder-directory-taken-for-held", "stockade/launch/hostcode.py",
           'if on_meta_path or name != "path"]', "]",
           (HOST + "test_a_path_an_import_finder_holds_is_host_code[path-entry]",)),
    Mutant("host-code-landlock-unmade-refusal-names-no-remedy", "stockade/linux/backend.py",
           '"made, which the landlock tier cannot stop: run the program from a "\n'
           '                    "directory outside the write roots, use',
           '"made, which the landlock tier cannot stop: use',
           (HOST + "test_the_landlock_refusal_of_an_editable_hook_key_says_what_it_is_and_the"
            "_remedy",)),
    # --- network.credentials and network.http (issue 34): the proxy's reading of requests --
    Mutant("credential-placeholder-sent-elsewhere", "stockade/net/inspect.py",
           'return _exfiltration(injection, "the request", what)', "continue",
           (EVIDENCE_NET + "net.credential-elsewhere]",
            "tests/test_proxy_credentials.py::test_the_placeholder_to_another_host_is_refused_and_logged["
            'header-request_bytes0]',
            "tests/test_proxy_credentials.py::test_the_placeholder_in_plain_http_to_another_host_is_refused")),
    Mutant("credential-placeholder-in-a-host-name", "stockade/net/inspect.py",
           'return replace(_exfiltration(injection, "the host name", what),\n'
           '                                   withhold_host=True)', "continue",
           (EVIDENCE_NET + "net.credential-hidden]",
            "tests/test_proxy_credentials.py::test_the_placeholder_in_a_host_name_is_refused_before_any_lookup[other]",)),
    Mutant("credential-placeholder-in-a-body", "stockade/net/inspect.py",
           'return _exfiltration(injection, "the request\'s body", what)', "continue",
           (EVIDENCE_NET + "net.credential-elsewhere]",
            "tests/test_proxy_credentials.py::test_a_body_placeholder_split_across_reads_is_found",)),
    Mutant("credential-body-scan-forgets-the-last-piece", "stockade/net/inspect.py",
           'self.tail = window[-self.keep:] if self.keep else b""', 'self.tail = b""',
           (EVIDENCE_NET + "net.credential-hidden]",
            "tests/test_proxy_credentials.py::test_a_body_placeholder_split_across_reads_is_found",)),
    Mutant("credential-sent-over-plain-http", "stockade/net/inspect.py",
           "if injection is not None and not tls:", "if False:",
           ("tests/test_proxy_credentials.py::test_the_credential_host_over_plain_http_is_refused",)),
    Mutant("http-rule-method-unchecked", "stockade/net/inspect.py",
           "if limit.methods and request.method not in limit.methods:", "if False:",
           (EVIDENCE_NET + "net.http-rules]",
            "tests/test_proxy_credentials.py::test_method_and_path_rules_hold_over_https["
            'POST-/repos/org/x-method_not_allowed]',
            "tests/test_proxy_credentials.py::test_method_and_path_rules_hold_over_plain_http")),
    Mutant("http-rule-path-dot-segments-unchecked", "stockade/net/inspect.py",
           'if _AMBIGUOUS.search(path) or any(s in (".", "..") for s in segments):', "if False:",
           (EVIDENCE_NET + "net.http-rules]",
            "tests/test_proxy_credentials.py::test_method_and_path_rules_hold_over_https["
            'GET-/repos/org/../other-path_ambiguous]',)),
    Mutant("http-rule-path-unchecked", "stockade/net/inspect.py",
           "if not any(path.startswith(prefix) for prefix in limit.paths):", "if False:",
           (EVIDENCE_NET + "net.http-rules]",
            "tests/test_proxy_credentials.py::test_method_and_path_rules_hold_over_https["
            'GET-/repos/other/x-path_not_allowed]',
            "tests/test_proxy_credentials.py::test_method_and_path_rules_hold_over_plain_http")),
    Mutant("http-ambiguous-framing-passed", "stockade/net/inspect.py",
           "if codings and lengths:", "if False:",
           (EVIDENCE_NET + "net.http-framing]",
            "tests/test_proxy_credentials.py::test_ambiguous_framing_is_refused[both]",)),
    Mutant("http-connect-inside-a-tunnel", "stockade/net/http.py",
           'raise HttpError(405, "CONNECT inside an intercepted tunnel", "connect_in_tunnel")',
           'return Request(method, *tunnel, version, "/", tuple(headers))',
           ("tests/test_proxy_credentials.py::test_http2_and_connect_inside_an_intercepted_tunnel_are_refused[connect]",)),
    Mutant("http-socks-to-an-inspected-host", "stockade/net/proxy.py",
           "if refusal is None and name and self._inspector.intercepts(name, port):", "if False:",
           ("tests/test_proxy_credentials.py::test_socks5_to_an_inspected_host_is_refused",)),
    Mutant("ca-key-beside-its-certificate", "stockade/net/authority.py",
           "for name, text in ((CA_FILE, self.pem),",
           'for name, text in ((CA_FILE, self.pem), ("ca-key.pem", self._key.private_bytes('
           "_crypto()[2].Encoding.PEM, _crypto()[2].PrivateFormat.PKCS8, "
           "_crypto()[2].NoEncryption()).decode()),",
           (EVIDENCE_NET + "net.credential-ca-key]",
            "tests/test_linux_credentials.py::test_the_server_gets_the_secret_and_the_sandbox"
            "_never_holds_it")),
    Mutant("intercepted-upstream-unverified", "stockade/net/authority.py",
           "context = ssl.create_default_context(cafile=cafile)",
           "context = ssl._create_unverified_context(cafile=cafile)",
           ("tests/test_proxy_credentials.py::test_an_upstream_that_fails_verification_is_not_sent_the_secret",)),
    Mutant("every-tunnel-intercepted", "stockade/net/proxy.py",
           "if self._inspector.intercepts(verdict.host, request.port):", "if True:",
           ("tests/test_proxy_credentials.py::test_a_host_no_rule_names_stays_a_blind_tunnel",)),
    Mutant("credential-file-in-the-view", "stockade/launch/compile.py",
           "if seen and not any(inside(real, hidden.path) for hidden in deny):", "if False:",
           ("tests/test_linux_credentials.py::test_a_secret_file_the_sandbox_could_read_is_refused",)),
    Mutant("credential-variable-passed-in", "stockade/launch/compile.py",
           "if spec.from_env and spec.from_env not in placed and spec.from_env in dict(env):",
           "if False:",
           ("tests/test_linux_credentials.py::test_the_source_variable_passed_into_the_sandbox_is_refused",)),
    Mutant("credential-secret-in-the-sandbox-environment", "stockade/launch/compile.py",
           "placed = {spec.env: spec.placeholder for spec in credentials}",
           "placed = {spec.env: os.environ.get(spec.from_env, spec.placeholder) "
           "for spec in credentials}",
           ("tests/test_linux_credentials.py::test_the_server_gets_the_secret_and_the_sandbox_never_holds_it",)),
    # approvals while running (issue 34 item 3): bounded, and lifting only the name rules
    Mutant("approval-lifts-the-address-checks", "stockade/net/gate.py",
           'problem = None if "addresses" in self.unchecked else self._refuse(address, port)',
           'problem = None if "addresses" in self.unchecked or asked '
           "else self._refuse(address, port)",
           (EVIDENCE_NET + "net.credential-guarded]",
            "tests/test_linux_approve.py::test_an_approval_lifts_no_address_check_nor_a_deny_pattern",)),
    Mutant("approval-asked-about-a-deny-pattern", "stockade/net/gate.py",
           "if not by_rule.allowed and by_rule.reason in ASKED and self.approval is not None:",
           "if not by_rule.allowed and self.approval is not None:",
           ("tests/test_linux_approve.py::test_an_approval_lifts_no_address_check_nor_a_deny_pattern",)),
    Mutant("approval-waits-for-ever", "stockade/net/approve.py",
           "over.wait(self.timeout)", "over.wait()",
           ("tests/test_linux_approve.py::test_no_timely_approval_is_a_denial[slow]",)),
    Mutant("approval-takes-any-answer", "stockade/net/approve.py",
           "answer = answers[0] if answers and answers[0] in (ALLOW_ONCE, ALLOW_RUN) \\\n",
           "answer = answers[0] if answers and True \\\n",
           ("tests/test_linux_approve.py::test_no_timely_approval_is_a_denial[yes]",)),
    Mutant("approval-once-kept-for-the-run", "stockade/net/approve.py",
           "        if answer == ALLOW_RUN:\n", "        if answer != DENY:\n",
           ("tests/test_linux_approve.py::test_an_approved_host_is_reached_and_logged",)),
    Mutant("credential-reflected-to-the-sandbox", "stockade/net/inspect.py",
           "if any(needle in lowered for needle in self.needles):", "if False:",
           ("tests/test_proxy_credentials.py::test_a_response_that_echoes_the_secret_is_cut_before_it[header]",)),
    Mutant("credential-compressed-response-asked", "stockade/net/inspect.py",
           'headers = [(n, v) for n, v in request.headers if n.lower() != "accept-encoding"]',
           "headers = list(request.headers)",
           ("tests/test_proxy_credentials.py::test_a_response_that_echoes_the_secret_is_cut_before_it[header]",)),
    Mutant("ask-takes-no-for-yes", "stockade/cli/ask.py",
           "return _ANSWERS.get(choice, DENY)", "return ALLOW_RUN",
           ("tests/test_linux_approve.py::test_stockade_run_ask_asks_at_the_terminal_not_the_"
            "commands_stdio[no]",)),
    Mutant("credential-chunked-response-scanned-raw", "stockade/net/inspect.py",
           'if ("transfer-encoding", "chunked") not in headers:', "if True:",
           ("tests/test_proxy_credentials.py::test_a_secret_split_by_the_servers_chunks_is_cut"
            "_before_it",
            "tests/test_linux_credentials.py::test_a_secret_echoed_in_split_chunks_never_reaches"
            "_the_sandbox")),
    Mutant("credential-compressed-response-passed", "stockade/net/inspect.py",
           'if any(n == "content-encoding" and v not in ("", "identity") for n, v in headers):',
           "if False:",
           ("tests/test_proxy_credentials.py::test_a_response_the_check_cannot_read_decoded_is"
            "_refused[gzip]",)),
    Mutant("credential-secret-to-another-host-passed", "stockade/net/inspect.py",
           '            *((form, "secret") for form in secret_forms(injection))]', "]",
           ("tests/test_proxy_credentials.py::test_the_secret_itself_to_another_host_is_refused"
            "[hex]",)),
    Mutant("ask-allows-without-the-host", "stockade/cli/ask.py",
           "if typed.strip() != asked.lower():", "if False:",
           ("tests/test_linux_approve.py::test_stockade_run_ask_asks_at_the_terminal_not_the_"
            "commands_stdio[another-host]",
            "tests/test_linux_approve.py::test_stockade_run_ask_asks_at_the_terminal_not_the_"
            "commands_stdio[without-host]")),
    Mutant("denial-host-unquoted", "stockade/launch/result.py",
           "shown = host if _PLAIN_HOST.fullmatch(host) else json.dumps(host)", "shown = host",
           ("tests/test_cli_denials.py::test_a_host_that_reads_like_a_den"
            "ial_is_quoted_and_grants_nothing",)),
    Mutant("denial-grant-for-an-invalid-host", "stockade/launch/denials.py",
           'if reason in ("not_allowed", "port_not_allowed"):',
           'if reason in ("not_allowed", "port_not_allowed", "invalid_host"):',
           ("tests/test_cli_denials.py::test_a_host_that_reads_like_a_den"
            "ial_is_quoted_and_grants_nothing",)),
    Mutant("denial-lines-in-the-commands-colours", "stockade/cli/run.py",
           "if lines and sys.stderr.isatty():", "if False:",
           ("tests/test_cli_denials.py::test_on_a_terminal_the_commands_colours_are_reset_"
            "before_the_denial_lines",)),
    Mutant("secret-forms-quoted-once-only", "stockade/net/inspect.py",
           'urllib.parse.quote(quoted, safe="").encode(),', "",
           ("tests/test_proxy_credentials.py::test_a_secret_reflected_enc"
            "oded_once_more_or_base64url_is_cut[twice-percent-encoded]",)),
    Mutant("secret-forms-without-base64url", "stockade/net/inspect.py",
           "*(form.translate(_URLSAFE) for form in encoded)}", "}",
           ("tests/test_proxy_credentials.py::test_a_secret_reflected_enc"
            "oded_once_more_or_base64url_is_cut[base64url]",)),
    Mutant("credential-variable-checked-as-is", "stockade/launch/credentials.py",
           "if any(form in lowered for form in forms):", "if injection.secret in value:",
           ("tests/test_linux_credentials.py::test_a_passed_variable_hold"
            "ing_the_secret_encoded_is_refused[basic-auth]",)),
    Mutant("secret-host-name-logged", "stockade/net/proxy.py",
           "WITHHELD if refusal.withhold_host else host", "host",
           ("tests/test_proxy_credentials.py::test_a_host_name_carrying_the_secret_is_logged_"
            "withheld[connect-secret]",)),
    Mutant("ask-takes-typed-ahead-keys", "stockade/cli/ask.py",
           "termios.tcflush(fd, termios.TCIFLUSH)", "pass",
           ("tests/test_linux_approve.py::test_stockade_run_ask_asks_at_the_terminal_not_the_"
            "commands_stdio[typed-ahead]",)),
    Mutant("path-rule-passes-unclear-paths", "stockade/net/inspect.py",
           "    if _UNCLEAR.search(path):", "    if False:",
           ("tests/test_proxy_credentials.py::test_a_path_servers_may_read_as_another_is_refused"
            "[semicolon]",)),
    Mutant("chunk-extension-not-scanned", "stockade/net/inspect.py",
           "refusal = scanner.alone(line)", "refusal = None",
           ("tests/test_proxy_credentials.py::test_chunk_lines_carry_no_placeholder_nor_a_bare_"
            "line_break[extension]",)),
    Mutant("chunk-lines-split-the-body-scan", "stockade/net/inspect.py",
           "refusal = scanner.alone(line)", "refusal = scanner.feed(line)",
           (EVIDENCE_NET + "net.credential-hidden]",
            "tests/test_proxy_credentials.py::test_a_placeholder_split_over_two_chunks_is_found",)),
    Mutant("chunk-line-bare-lf-passed", "stockade/net/inspect.py",
           "        if _bare_break(line):", "        if False:",
           ("tests/test_proxy_credentials.py::test_chunk_lines_carry_no_placeholder_nor_a_bare_"
            "line_break[bare-lf-line]",)),
    Mutant("chunk-trailer-bare-lf-passed", "stockade/net/inspect.py",
           "                if _bare_break(trailer):", "                if False:",
           ("tests/test_proxy_credentials.py::test_chunk_lines_carry_no_placeholder_nor_a_bare_"
            "line_break[bare-lf-trailer]",)),
    Mutant("approval-questions-unbounded", "stockade/net/approve.py",
           "if self._pending >= MAX_PENDING:", "if False:",
           ("tests/test_linux_approve.py::test_unanswered_questions_are_bounded",)),
    Mutant("approval-asks-after-the-denial", "stockade/net/approve.py",
           "if gone.is_set():", "if False:",
           ("tests/test_linux_approve.py::test_a_question_whose_connection_was_denied_is_not"
            "_asked_late",)),
    # denial provenance (issue 34 item 4): the CLI says each denial, and names no grant for
    # what no policy may allow (a credential's placeholder sent to another host)
    Mutant("denial-grant-for-an-exfiltration", "stockade/launch/denials.py",
           'if reason in ("not_allowed", "port_not_allowed"):', "if True:",
           ("tests/test_cli_denials.py::test_network_denials_are_said_with_the_grant_that_would"
            "_allow_them",)),
    Mutant("cli-denials-unsaid", "stockade/cli/run.py",
           "        print_violations(result)\n", "        pass\n",
           ("tests/test_cli_denials.py::test_filesystem_and_limit_denials_are_said_with_the"
            "_grant",)),
    # a Workspace's approvals (stockade mcp --ask): each call's own, for that call only
    Mutant("workspace-approval-run-kept-past-the-call", "stockade/integrations/workspace.py",
           "call = None if approve is None else Approval(approve, self.approve_timeout)",
           "call = None if approve is None else relay.call or Approval(approve, "
           "self.approve_timeout)",
           ("tests/test_linux_approve.py::test_a_workspace_asks_each_calls_own_approver_for"
            "_that_call_only",)),
    Mutant("workspace-unasked-call-allowed", "stockade/integrations/workspace.py",
           "        if call is None:\n            return DENY\n",
           "        if call is None:\n            return ALLOW_ONCE\n",
           ("tests/test_linux_approve.py::test_a_workspace_asks_each_calls_own_approver_for"
            "_that_call_only",)),
    Mutant("workspace-approval-outlives-its-call", "stockade/integrations/workspace.py",
           "                    call.close()      # what asks after it",
           "                    pass  # what asks after it",
           ("tests/test_linux_approve.py::test_what_a_call_left_waiting_is_denied_not_put_to_"
            "the_next_call",)),
    Mutant("workspace-approvals-with-keep-detached", "stockade/integrations/workspace.py",
           "if approvals and keep_detached:", "if False:",
           ("tests/test_linux_approve.py::test_workspace_approvals_are_not_had_with_keep_"
            "detached",)),
    Mutant("workspace-question-routed-at-its-turn", "stockade/net/approve.py",
           "                    if gone.is_set():", "                    if False:",
           ("tests/test_linux_approve.py::test_what_a_call_left_waiting_is_denied_not_put_to_"
            "the_next_call",)),
    # stockade mcp --ask: the client's answer is the approval; a client that cannot be asked
    # is denied (and told why), never asked (run with .venv-integrations/bin/python)
    Mutant("mcp-ask-takes-any-choice", "stockade/integrations/mcp.py",
           "return _CHOICES.get(answered.data.choice, DENY)", "return ALLOW_RUN",
           ("tests/integrations/test_mcp.py::test_the_client_is_asked_and_its_answer_is_the"
            "_approval",)),
    Mutant("mcp-asks-a-client-that-cannot-answer", "stockade/integrations/mcp.py",
           "self.why_not = why_not_asked(ctx.request_context.session)", "self.why_not = None",
           ("tests/integrations/test_mcp.py::test_a_client_that_cannot_be_asked_is_denied_and"
            "_told_why",)),
    Mutant("leaf-cache-unbounded", "stockade/net/authority.py",
           "while len(self._contexts) > LEAVES:", "while False:",
           ("tests/test_proxy_credentials.py::test_the_leaf_cache_is_bounded",)),
    Mutant("credential-folded-response-head-passed", "stockade/net/inspect.py",
           'if refusal is None and any(line[:1] in (" ", "\\t") for line in lines[1:]):',
           "if False:",
           ("tests/test_proxy_credentials.py::test_a_response_the_check_cannot_read_decoded_is"
            "_refused[folded]",)),
    Mutant("cli-facts-count-fileless-modules", "stockade/cliwire.py",
           " and where not in FILELESS})", "})",
           ("tests/test_autoserver.py::test_a_client_that_imported_no_importlib_is_served",)),
    # `stockade serve --agent-sandbox` (no authentication of its own) binds beyond loopback
    # only with --allow-remote, and bounds every request body
    Mutant("agent-sandbox-any-host-is-loopback", "stockade/integrations/agent_sandbox.py",
           "return ipaddress.ip_address(host).is_loopback", "return True",
           ("tests/test_agent_sandbox_server.py::"
            "test_binding_beyond_loopback_must_be_asked_for",)),
    Mutant("agent-sandbox-unbounded-body", "stockade/integrations/agent_sandbox.py",
           "if length > limit:", "if False:",
           ("tests/test_agent_sandbox_server.py::"
            "test_request_bodies_are_bounded_and_a_refusal_writes_nothing",)),
    # a web page (no preflight, or DNS rebinding) cannot drive it: Origin, foreign Host and a
    # non-JSON /execute are refused
    Mutant("agent-sandbox-origin-served", "stockade/integrations/agent_sandbox.py",
           'if self.headers.get("Origin") is not None:', "if False:",
           ("tests/test_agent_sandbox_server.py::test_what_a_web_page_can_send_is_refused",)),
    Mutant("agent-sandbox-any-host-served", "stockade/integrations/agent_sandbox.py",
           "if self.server.hosts is not None and host not in self.server.hosts:", "if False:",
           ("tests/test_agent_sandbox_server.py::test_what_a_web_page_can_send_is_refused",)),
    Mutant("agent-sandbox-execute-not-json-served", "stockade/integrations/agent_sandbox.py",
           '                and kind != "application/json":', "                and False:",
           ("tests/test_agent_sandbox_server.py::test_what_a_web_page_can_send_is_refused",)),
    # the framing is read strictly (no request smuggled past a proxy reading it otherwise), and
    # a chunk past the body limit is dropped as it arrives, never held
    Mutant("agent-sandbox-chunk-size-lenient", "stockade/integrations/agent_sandbox.py",
           'if not line.endswith(b"\\n") or not _CHUNK_SIZE.fullmatch(size):',
           'if not line.endswith(b"\\n"):',
           ("tests/test_agent_sandbox_server.py::test_request_framing_is_read_strictly",)),
    Mutant("agent-sandbox-chunk-read-before-the-limit", "stockade/integrations/agent_sandbox.py",
           "if total > limit:  # (checked before the chunk is read", "if False:  # (",
           ("tests/test_agent_sandbox_server.py::test_a_chunk_past_the_limit_is_never_held",)),
    Mutant("agent-sandbox-any-transfer-coding-chunked", "stockade/integrations/agent_sandbox.py",
           'if codings != ["chunked"]:', "if False:",
           ("tests/test_agent_sandbox_server.py::test_request_framing_is_read_strictly",)),
    Mutant("agent-sandbox-both-framings-served", "stockade/integrations/agent_sandbox.py",
           "if codings and lengths:", "if False:",
           ("tests/test_agent_sandbox_server.py::test_request_framing_is_read_strictly",)),
    Mutant("agent-sandbox-content-length-lenient", "stockade/integrations/agent_sandbox.py",
           "(lengths and not _LENGTH.fullmatch(lengths[0]))", "False",
           ("tests/test_agent_sandbox_server.py::test_request_framing_is_read_strictly",)),
    Mutant("agent-sandbox-lenient-head", "stockade/integrations/agent_sandbox.py",
           "        if any(isinstance(defect, email.errors.MissingHeaderBodySeparatorDefect)",
           "        if False and any(isinstance(defect, "
           "email.errors.MissingHeaderBodySeparatorDefect)",
           ("tests/test_agent_sandbox_server.py::test_a_leniently_readable_head_is_refused",)),
    Mutant("agent-sandbox-deep-json-uncaught", "stockade/integrations/agent_sandbox.py",
           "AttributeError, RecursionError):", "AttributeError):",
           ("tests/test_agent_sandbox_server.py::test_a_leniently_readable_head_is_refused",)),
    Mutant("agent-sandbox-get-body-unread", "stockade/integrations/agent_sandbox.py",
           "if self._framing() != (False, 0):", "if False:",
           ("tests/test_agent_sandbox_server.py::test_request_framing_is_read_strictly",)),
    # an upload's multipart body is parsed only up to its "file" part, its parts bounded
    Mutant("agent-sandbox-multipart-parts-unbounded", "stockade/integrations/agent_sandbox.py",
           "for _ in range(MAX_PARTS):", "while True:",
           ("tests/test_agent_sandbox_server.py::test_a_multipart_upload_is_parsed_only_up_to_its_file"
            "_part",)),
    Mutant("agent-sandbox-multipart-head-unbounded", "stockade/integrations/agent_sandbox.py",
           "min(end, start + MAX_PART_HEAD)", "end",
           ("tests/test_agent_sandbox_server.py::test_a_multipart_upload_is_parsed_only_up_to_its_file"
            "_part",)),
    Mutant("agent-sandbox-multipart-parsed-whole", "stockade/integrations/agent_sandbox.py",
           "for headers, data in _parts(body, boundary.encode()):",
           "for headers, data in list(_parts(body, boundary.encode())):",
           ("tests/test_agent_sandbox_server.py::test_a_multipart_upload_is_parsed_only_up_to_its_file"
            "_part",)),
    # what the kernel refuses is a typed 4xx (a 5xx, the SDK retries)
    Mutant("file-name-too-long-untyped", "stockade/integrations/fileop.py",
           'errno.ENAMETOOLONG: "name_too_long",', "",
           ("tests/test_agent_sandbox_server.py::test_what_the_kernel_refuses_is_a_typed_client"
            "_error",)),
    Mutant("file-fifo-without-reader-untyped", "stockade/integrations/fileop.py",
           'errno.ENXIO: "not_a_regular_file"}', "}",
           ("tests/test_agent_sandbox_server.py::test_what_the_kernel_refuses_is_a_typed_client"
            "_error",)),
    Mutant("agent-sandbox-command-past-one-argument", "stockade/integrations/agent_sandbox.py",
           'if len(command.encode(errors="surrogatepass")) >= MAX_ARGUMENT:', "if False:",
           ("tests/test_agent_sandbox_server.py::test_what_the_kernel_refuses_is_a_typed_client"
            "_error",)),
    # commands that hang hold up neither health nor files (attack A7): past --max-concurrent
    # one more is refused at once, file operations have sandboxes of their own, and a client
    # that hangs up has its command's tree killed
    Mutant("agent-sandbox-commands-queue-past-the-cap", "stockade/integrations/agent_sandbox.py",
           "if self.executing >= self.max_concurrent:", "if False:",
           ("tests/test_agent_sandbox_server.py::test_hung_commands_hold_up_neither_health_nor"
            "_files_and_one_more_is_refused",)),
    Mutant("agent-sandbox-files-behind-commands", "stockade/integrations/agent_sandbox.py",
           "workspace = self.server.files", "workspace = self.server.commands",
           ("tests/test_agent_sandbox_server.py::test_hung_commands_hold_up_neither_health_nor"
            "_files_and_one_more_is_refused",)),
    Mutant("agent-sandbox-hangup-ignored", "stockade/integrations/agent_sandbox.py",
           "extra > HANGUP_EXTRA:\n                    cancel.set()\n",
           "extra > HANGUP_EXTRA:\n                    pass\n",
           ("tests/test_agent_sandbox_server.py::test_hung_commands_hold_up_neither_health_nor"
            "_files_and_one_more_is_refused",)),
    # (attack K1) a byte sent while the command runs does not end the watch for its close;
    # a client streaming meanwhile is cancelled; a connection that sent more ends there
    Mutant("agent-sandbox-hangup-watch-ends-at-a-byte", "stockade/integrations/agent_sandbox.py",
           "                if data:\n                    spoiled.set()\n",
           "                if data:\n                    return\n",
           ("tests/test_agent_sandbox_server.py::"
            "test_bytes_sent_while_a_command_runs_do_not_end_the_hangup_watch",)),
    Mutant("agent-sandbox-hangup-extra-unbounded", "stockade/integrations/agent_sandbox.py",
           "if not data or extra > HANGUP_EXTRA:", "if not data:",
           ("tests/test_agent_sandbox_server.py::"
            "test_bytes_sent_while_a_command_runs_do_not_end_the_hangup_watch",)),
    Mutant("agent-sandbox-spoiled-connection-kept", "stockade/integrations/agent_sandbox.py",
           "            if spoiled.is_set():", "            if False:",
           ("tests/test_agent_sandbox_server.py::"
            "test_bytes_sent_while_a_command_runs_do_not_end_the_hangup_watch",)),
    # (attack K9) every StockadeError unpickles whole (a Ray task's error crosses processes)
    Mutant("errors-pickled-by-init", "stockade/errors.py",
           "return _rebuilt, (type(self), made, self.args, dict(vars(self)))",
           "return super().__reduce__()",
           ("tests/test_error_pickling.py::test_every_stockade_error_survives_a_pickle_round_trip",)),
    Mutant("errors-oserror-fields-lost", "stockade/errors.py",
           "if isinstance(self, OSError) else", "if False else",
           ("tests/test_error_pickling.py::test_every_stockade_error_survives_a_pickle_round_trip",)),
    # (attack K8) /exists looks the name up alone, never lists its directory
    Mutant("workspace-exists-lists-the-parent", "stockade/integrations/workspace.py",
           'self._fileop("exists", path)',
           'self._fileop("list", os.path.dirname(os.fspath(path)) or ".")',
           ("tests/test_agent_sandbox_server.py::test_exists_looks_up_the_name_alone",)),
    Mutant("workspace-exists-through-a-file-refused", "stockade/integrations/workspace.py",
           'if exc.code in ("not_found", "not_a_directory"):\n                return False',
           'if exc.code == "not_found":\n                return False',
           ("tests/test_agent_sandbox_server.py::test_exists_looks_up_the_name_alone",)),
    # (attacks K2/K3) a request head is bounded in bytes and time, connections in number
    Mutant("agent-sandbox-head-unbounded", "stockade/integrations/agent_sandbox.py",
           "        if self.left <= 0:\n            raise", "        if False:\n            raise",
           ("tests/test_agent_sandbox_server.py::"
            "test_request_heads_are_bounded_in_size_time_and_number",)),
    Mutant("agent-sandbox-head-no-deadline", "stockade/integrations/agent_sandbox.py",
           "time.monotonic() + HEAD_SECONDS", "time.monotonic() + 3600",
           ("tests/test_agent_sandbox_server.py::"
            "test_request_heads_are_bounded_in_size_time_and_number",)),
    Mutant("agent-sandbox-connections-unbounded", "stockade/integrations/agent_sandbox.py",
           "refused = self.connections >= self.max_connections", "refused = False",
           ("tests/test_agent_sandbox_server.py::"
            "test_request_heads_are_bounded_in_size_time_and_number",)),
    # (attack K5, in part) an answer is UTF-8 JSON, not 6 bytes per undecodable byte
    Mutant("agent-sandbox-answer-ascii-escaped", "stockade/integrations/agent_sandbox.py",
           "json.dumps(value, ensure_ascii=False)", "json.dumps(value)",
           ("tests/test_agent_sandbox_server.py::test_undecodable_output_is_answered_in_utf8",)),
    Mutant("agent-sandbox-answer-surrogate-unencodable", "stockade/integrations/agent_sandbox.py",
           '.encode(errors="backslashreplace")', ".encode()",
           ("tests/test_agent_sandbox_server.py::test_undecodable_output_is_answered_in_utf8",)),
    Mutant("argv-lone-surrogate-passed", "stockade/launch/compile.py",
           "os.fsencode(argument)  # (a lone surrogate", "pass  # (",
           ("tests/test_agent_sandbox_server.py::test_what_the_kernel_refuses_is_a_typed_client"
            "_error",)),
    # a view prepared ahead (a template built on after its run returned, a CLI server's
    # skeleton) makes nothing in the workspace its owner may be removing
    Mutant("prepared-view-makes-git-files", "stockade/linux/mnt.py",
           "make=not identify)", "make=True)",
           ("tests/test_linux_prepared.py::test_a_view_prepared_ahead_makes_nothing_in_the"
            "_workspace[template]",
            "tests/test_linux_prepared.py::test_a_view_prepared_ahead_makes_nothing_in_the"
            "_workspace[skeleton]")),
    Mutant("unmaking-walk-makes-git-files", "stockade/linux/gitdirs.py",
           "if mode is None and made and not self.make:", "if False:",
           ("tests/test_linux_prepared.py::test_a_view_prepared_ahead_makes_nothing_in_the"
            "_workspace[template]",)),
    # a Windows allowlist launch sets each proxy variable once (attack on issue 36, E1-E3):
    # both cases refused every launch at the check, in the broker and in the guest
    Mutant("windows-proxy-env-both-cases", "stockade/net/env.py",
           "env = dict(names) if case_insensitive else names | {", "env = names | {",
           (PROXY_ENV + "test_a_windows_allowlist_launch_compiles_to_an_environment_the_check"
            "_accepts",)),
    Mutant("windows-proxy-env-beside-another-case", "stockade/net/env.py",
           "    if case_insensitive:\n        taken", "    if False:\n        taken",
           (PROXY_ENV + "test_the_launch_network_sets_the_proxy_once_over_any_case_of_its_name",)),
    Mutant("broker-bad-request-untyped", "stockade/windows/broker.py",
           "except ValueError as exc:  # (a request Windows", "except KeyError as exc:  # (",
           (PROXY_ENV + "test_a_broker_refuses_a_request_windows_cannot_hold_typed[env0]",)),
    # a kept guest's proxy was made from its booting execution's allow/deny (attack on issue
    # 36, W2): an execution with another allowlist boots its own
    Mutant("wsb-shape-without-egress", "stockade/vm/wsb_plan.py",
           "self.network, self.egress, self.memory_mb", "self.network, self.memory_mb",
           ("tests/test_vm_wsb_reuse.py::test_a_kept_guest_is_not_reused_by_an_execution_with"
            "_another_allowlist[first0-second0-raw.githubusercontent.com]",)),
    # the exemption never outlives the filters (attack on issue 36, F7)
    Mutant("fence-filters-removed-past-a-stuck-exemption", "stockade/windows/fence.py",
           'if detail["sid"].upper() in stuck:', "if False:",
           (FENCE + "test_the_filters_stay_while_the_exemption_cannot_be_removed",)),
    # the fence service outlives callers who hold its pipe (attack on issue 36, F1/F2): no
    # instance left is retried, an idle or slow frame is cut, one user has a share
    Mutant("fence-service-ends-on-a-busy-pipe", "stockade/windows/fenceservice.py",
           "except OSError as exc:  # (every instance taken", "except KeyError as exc:  # (",
           (FENCE_SERVICE + "test_callers_that_send_nothing_neither_stop_the_service_nor_keep"
            "_its_instances",)),
    Mutant("fence-idle-caller-kept", "stockade/windows/fence.py",
           "if not idle:\n            self._arm()", "if False:\n            self._arm()",
           (FENCE_SERVICE + "test_callers_that_send_nothing_neither_stop_the_service_nor_keep"
            "_its_instances",)),
    Mutant("fence-frame-begun-unbounded", "stockade/windows/fence.py",
           "if data:\n                self._arm()", "if False:\n                self._arm()",
           (FENCE_SERVICE + "test_a_fence_holder_may_wait_idle_but_not_inside_a_frame[a-frame"
            "-begun-and-not-ended]",)),
    Mutant("fence-one-user-takes-every-instance", "stockade/windows/fenceservice.py",
           "if self._users[caller.user] >= fence.MAX_PER_USER:", "if False:",
           (FENCE_SERVICE + "test_one_user_holds_at_most_its_share_of_the_pipe",)),
    # a guest without a network is not kept (attack on issue 36, W3/W4): its spool is its
    # session's whole log where its commands may reach; the spool's writers append
    Mutant("wsb-none-guest-kept", "stockade/vm/wsb.py",
           "reuse=reuse and self.guest.plan.networking", "reuse=reuse",
           ("tests/test_vm_wsb_reuse.py::test_a_guest_without_a_network_is_never_kept[none-False]",)),
    Mutant("wsb-spool-writes-at-its-own-offset", "stockade/vm/wsb_spool.py",
           "self._fd = _open(path, os.O_WRONLY | os.O_APPEND)",
           "self._fd = _open(path, os.O_WRONLY)",
           (WSB_AGENT + "test_a_spool_writer_appends_after_bytes_another_process_added",)),
    Mutant("wsb-spool-records-unauthenticated", "stockade/vm/wsb_spool.py",
           "if not hmac.compare_digest(mac, _mac(self._key, self._number, body)):", "if False:",
           (WSB_AGENT + "test_the_host_refuses_what_is_not_the_agents_next_record[another-key]",
            WSB + "test_a_command_that_reaches_the_spool_cannot_forge_its_result")),
    Mutant("wsb-spool-record-replayed", "stockade/vm/wsb_spool.py",
           "            self._number += 1\n            data += body",
           "            data += body",
           (WSB_AGENT + "test_the_host_refuses_what_is_not_the_agents_next_record[a-record"
            "-replayed]",)),
    # a package SID is the profile name's, whoever's (attack on issue 36, F3)
    Mutant("fence-sid-of-another-users-process", "stockade/windows/fence.py",
           "if self._fences.holders(target.package) - {self._caller.user}:", "if False:",
           (FENCE + "test_a_package_sid_another_users_process_holds_is_not_fenced[owners2"
            "-False]",)),
)
