"""The Windows backend's rows of the enforcement report (stockade/launch/report.py), computed
from the facts the Windows readiness probe verified (probe.py) and from what `check` refuses.

A row rests on the facts the probe observed about its launch: from outside, what the backend
read back from the suspended child (token, Job membership and settings, handles held,
mitigation policies, the desktop's and window station's entries, the broker that made it) and
the access-control changes made and exactly reverted; from inside, the probe child's own report
(its token, Job, mitigations, desktop, environment, and its file and loopback attempts). What
neither shows (a listening socket, DNS, named pipes, the registry) is said in the reason, not
claimed. The `windows_sandbox` row is the Windows Sandbox driver's (containment "vm"): whether
this host has what a guest needs, by the driver's own host checks, typed where it has not.
"""

from __future__ import annotations

from stockade.launch import registry
from stockade.launch.backend import Backend
from stockade.launch.probe import Attestation
from stockade.launch.report import ENFORCED, UNAVAILABLE, Row, accepted, driver_row, row_maker
from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.windows.probe import NESTED_UI, verified

# What enforces the network modes past `none`, through the egress fence service (netfence.py):
# `accepted` makes each row unavailable, with check's reason, where the service does not answer.
ALLOWLIST = ("Stockade's proxy on the host's 127.0.0.1 (domain rules, address guard, denial "
             "log); the fence service's loopback exemption for the launch's AppContainer and "
             "WFP filters keyed to its package SID blocking every loopback port but the proxy's")
ANY = ("the internetClient capability, loopback isolation kept; the fence service's WFP "
       "filters keyed to the launch's package SID blocking the destination guard's ranges "
       "(link-local, metadata, private, reserved) and the host itself")
# The VM driver behind the `windows_sandbox` row (containment "vm" on Windows: vm/wsb.py).
WINDOWS_SANDBOX = "windows-sandbox"
# What rules.check accepts, on any platform: a drive path for the root and working directory.
_PLAIN = LaunchRequest(argv=("cmd.exe",), cwd="C:\\", env=(), read=(PathGrant("C:\\", "C:\\"),))


def rows(attestation: Attestation, backend: Backend) -> tuple[Row, ...]:
    row = row_maker(attestation, verified)
    token = ("appcontainer_token", "launch_package_sid", "capabilities",
             "child_appcontainer_token", "child_launch_package_sid", "child_capabilities")
    job = ("in_job", "job_kill_on_close", "job_breakaway", "child_in_job", "child_sees_the_job")
    acl = ("acl_grants", "acl_restored")
    overrides = ("acl_overrides", "acl_restored")
    images = ("no_low_label_images", "extension_points_disabled", "no_remote_images",
              "child_mitigations_as_read_back")
    desktop = ("private_desktop", "desktop_rights", "station_rights")
    default_desktop = "" if attestation.facts.get("default_desktop") == "denied" else (
        "the user's own desktop (Default) opens from inside: the window station is the user's; "
        "the Job's UI restrictions still keep other processes' windows, the clipboard and "
        "input switching out of reach")
    no_network = ("an AppContainer token without capabilities but its runtime roots' read "
                  "capabilities: no network capability at all")
    return (
        row("identity", "a fresh AppContainer profile per launch, no capabilities but its "
            "runtime roots' read capabilities; the child's token checked before its first "
            "instruction",
            {"token": token, "settlement": ("profile_deleted",)},
            "deleted at settlement; its name is never handed out again"),
        row("broker", "a one-shot broker process per launch starts the child through the "
            "AppContainer launcher, only from a closed manifest bound to its PID, a nonce and "
            "the digest it recomputes from the whole request; the manifest is consumed",
            {"broker": ("launch_brokered", "manifest_consumed")},
            "the broker runs as the owner's user: it binds each launch to the request its "
            "digest names and keeps the launcher behind that check, not a boundary against "
            "that user's own processes"),
        row("filesystem.read", "read+execute entries for the launch's package SID on each read "
            "root", {"acl": acl, "child": ("outside_path",)},
            partial="anything open to every AppContainer (ALL APPLICATION PACKAGES: "
                    "C:\\Windows, C:\\Program Files, ...) is readable whatever the policy"),
        row("filesystem.write", "modify entries (no FILE_DELETE_CHILD, WRITE_DAC, WRITE_OWNER) "
            "on each write root, inherited by what the child creates",
            {"acl": acl, "child": ("write_root",)}),
        row("filesystem.deny", "a protected DACL without the launch's entries",
            {"acl": overrides, "child": ("denied_path",)},
            "refused when every AppContainer may read the path"),
        row("filesystem.protected", "each occurrence made read-only (a protected DACL), the "
            "directories above it unable to be deleted or renamed",
            {"acl": overrides, "child": ("protected_name",)},
            partial="only names present at launch; a name created during the run is writable"),
        row("filesystem.git", "every .git made read-only whole, as a protected name",
            {"acl": overrides}, partial="\"guarded\" is enforced as \"read-only\": git can "
                                        "read a repository but not commit"),
        row("filesystem.exec_from_write", "files in write roots lack FILE_EXECUTE; images with "
            "a Low label refused by mitigation policy", {"acl": acl, "mitigations": images},
            "an interpreter from a read root may still read and run a script from a write root"),
        row("filesystem.links", "roots with reparse points (but cloud placeholders) and write "
            "roots with multiply-linked files refused before any access control changes",
            {"acl": acl}, "a multiply-linked file in a read root is readable through its "
            "other names too (the same content)"),
        row("network.none", no_network, {"token": token, "child": ("tcp_loopback",)},
            "the probe shows a loopback connection refused; TCP and UDP elsewhere, DNS and "
            "listeners are for the Windows real-child tests"),
        row("network.loopback", "AppContainer loopback isolation; a loopback exemption only "
            "under `allowlist`, confined by the fence's WFP filters to the proxy's port",
            {"token": token, "child": ("tcp_loopback",)},
            "host services on 127.0.0.1 are unreachable"),
        row("network.link_local", no_network, {"token": token},
            "under network `any`, the fence service's WFP filters for the launch's package SID "
            "(see network.any)"),
        row("network.listeners", "no internetClientServer or privateNetworkClientServer "
            "capability: nothing outside can connect in", {"token": token},
            partial="whether it may open a listening socket at all is not verified (the "
                    "Windows real-child tests are to show it)"),
        row("network.inherited_handles", "PROC_THREAD_ATTRIBUTE_HANDLE_LIST: only stdin, stdout "
            "and stderr are inherited",
            {"handles": ("inherited_standard", "inherited_outside_list")}),
        accepted(backend, "network.allowlist", NetworkSpec("allowlist", ("example.com",)),
                 ALLOWLIST, base=_PLAIN),
        accepted(backend, "network.any", NetworkSpec("any"), ANY, base=_PLAIN),
        row("env", "the request's closed environment as the environment block",
            {"environment": ("environment",)}),
        row("limits.memory", "Job memory limit", {"job": ("job_memory",)},
            "the whole tree's committed memory"),
        row("limits.pids", "Job active-process limit", {"job": ("job_active_processes",)},
            "processes, not threads"),
        accepted(backend, "limits.file_size", LimitSpec(file_size=1 << 20),
                 "no per-file size limit exists on Windows", base=_PLAIN),
        accepted(backend, "limits.cpu", LimitSpec(cpu=1.0), "Job CPU rate, hard cap",
                 base=_PLAIN),
        row("limits.timeout", "wall clock; the Job is terminated", {"job": job + ("timeout",)},
            "hard: the whole tree ends"),
        Row("limits.output", ENFORCED if attestation.ready else UNAVAILABLE,
            "captured bytes per stream", "hard, enforced by the owner"),
        row("kill_on_close", "Job kill-on-close, attached at creation, no breakaway",
            {"job": job}, "the owner holds the only handle: its death ends the tree"),
        row("desktop", "a private desktop per launch (bounded heap), Low integrity label, the "
            "AppContainer allowed only to attach and create windows, and only to read the "
            "window station's attributes and atoms", {"desktop": desktop},
            partial=default_desktop),
        row("ui_restrictions", "Job UI restrictions: other processes' windows, clipboard, "
            "system parameters, display settings, global atoms, desktops, logging off",
            {"job": ("job_ui_restrictions",)},
            partial="not in force here: this process is in a Job that keeps its children, and "
                    "Windows nests a Job only if neither sets UI limits (the private desktop and "
                    "the AppContainer remain)"
            if attestation.facts.get("job_ui_restrictions") == NESTED_UI
            else ""),
        row("settlement", "the Job terminated and drained, the desktop closed, every "
            "access-control change (files, window station) reverted, the profile deleted, the "
            "ledger record removed",
            {"lifetime": ("profile_deleted", "acl_restored", "station_restored",
                          "ledger_settled")},
            "after a crash, the next reconcile does the same from the ledger"),
        # Containment "vm": the driver's own host checks (Windows, the `wsb` tool or
        # WindowsSandbox.exe, which the optional feature installs); no guest is booted here.
        driver_row("windows_sandbox", registry.entry(WINDOWS_SANDBOX)),
    )
