"""Named starting points for policies, as policy documents (parsed like any other).

| preset                  | read      | write | home    | exec | net        | time | memory | pids |
| ----------------------- | --------- | ----- | ------- | ---- | ---------- | ---- | ------ | ---- |
| read-only               | system,ws | -     | host    | no   | none       | 10m  | 2GiB   | 512  |
| workspace-write         | system    | ws    | private | yes  | none       | 10m  | 2GiB   | 512  |
| workspace-write-no-exec | system    | ws    | private | no   | none       | 10m  | 2GiB   | 512  |
| offline-build           | system    | ws    | private | yes  | none       | 30m  | 4GiB   | 1024 |
| networked-build         | system    | ws    | private | yes  | registries | 30m  | 4GiB   | 1024 |

The interactive presets (10m) cap output at 16MiB and files at 1GiB, the build presets (30m) at
64MiB and 4GiB. `workspace-write` runs what the job builds in the workspace (a venv's scripts,
compiled extensions, `make && ./prog`); `workspace-write-no-exec` is the same without that:
nothing written there can be executed (noexec mounts, Landlock, pid 1's exec and memfd watches).

"ws" is `{workspace}`; "home" is `filesystem.home` (on Windows "host" in every preset); "exec" is
`exec_from_write`; "time" is `timeout`;
"registries" is allowlist mode with `REGISTRIES` (package registries and source hosts; which
ports a port-less pattern admits is the proxy's rule).

"system" is `/usr` and `/etc`, plus `/bin`, `/sbin`, `/lib`, `/lib32`, `/lib64` where they exist
(a leading `?` marks a root optional). No preset limits `cpu`. Every preset denies the credential
stores in `DENY_DEFAULTS`, passes only `ENV_PASS_DEFAULTS`, keeps the model's protected names,
and leaves stdin to the caller (`process.stdin` unset: see model.STDIN_MODES).

On Windows (`preset_documents("win32")`, what `PRESET_DOCUMENTS` holds there) the presets are
the same but for what names Linux: "system" is `WINDOWS_SYSTEM_READ`; the denied credential
stores are `WINDOWS_DENY_DEFAULTS` (the home directory's, without `/etc`); what most Windows
programs fail without is passed too (`WINDOWS_ENV_PASS_DEFAULTS`: `SystemRoot`, `PATHEXT`,
`ComSpec`, `USERPROFILE`, ...; `TEMP` and `TMP` are the backend's); and no `file_size` is set,
since Windows has no per-file size limit (the backend refuses one). `networked-build` keeps its
allowlist, which the Windows backend refuses (`unenforceable:network.allowlist`) until it has
a network helper. Everything every AppContainer may read (`C:\\Windows`, `C:\\Program Files`) is
readable on Windows whatever the preset; see docs/windows.md.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SYSTEM_READ = ("/usr", "/etc", "?/bin", "?/sbin", "?/lib", "?/lib32", "?/lib64")
DENY_DEFAULTS = (
    "{home}/.ssh", "{home}/.aws", "{home}/.azure", "{home}/.gnupg", "{home}/.config/gcloud",
    "{home}/.config/gh", "{home}/.docker", "{home}/.kube", "{home}/.netrc",
    "{home}/.git-credentials", "{home}/.pypirc",
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd",
    # (the host's private keys and passwords in /etc, which root reads in a sandbox too: VPNs,
    # Wi-Fi, cluster admin credentials, service accounts, whole where a directory mixes them
    # with what else a tool there reads (MySQL's debian.cnf, a password in conf.d: clients
    # skip a defaults file they cannot open); each skipped where it does not exist, at the
    # cost of one failed open)
    "/etc/wireguard", "/etc/NetworkManager/system-connections", "/etc/wpa_supplicant",
    "/etc/netplan", "/etc/openvpn", "/etc/ipsec.secrets", "/etc/ipsec.d/private",
    "/etc/swanctl", "/etc/strongswan", "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets",
    "/etc/kubernetes", "/etc/rancher", "/etc/mysql", "/etc/pki/tls/private",
    "/etc/pki/CA/private", "/etc/letsencrypt", "/etc/krb5.keytab", "/etc/sssd",
    "/etc/libvirt/secrets",
    # (mail relays, LDAP binds, systemd credentials, Ceph, DKIM, rsync, NTP, BIND, WebDAV,
    # iSCSI: attack 8)
    "/etc/postfix/sasl_passwd", "/etc/postfix/sasl_passwd.db", "/etc/ldap.secret",
    "/etc/pam_ldap.secret", "/etc/credstore", "/etc/credstore.encrypted",
    "/etc/ceph/ceph.client.admin.keyring", "/etc/dkimkeys", "/etc/rsyncd.secrets",
    "/etc/chrony/chrony.keys", "/etc/chrony.keys", "/etc/bind/rndc.key", "/etc/rndc.key",
    "/etc/davfs2/secrets", "/etc/msmtprc", "/etc/exim4/passwd.client", "/etc/iscsi/iscsid.conf",
)
# The denied defaults that are files (the rest are directories): what a refusal of a missing
# one tells the user to make empty (stockade/launch/compile.py).
DENY_FILES = (".netrc", "_netrc", ".git-credentials", ".pypirc", "ipsec.secrets",
              "chap-secrets", "pap-secrets", "krb5.keytab", "shadow", "shadow-", "gshadow",
              "gshadow-", "sudoers", "opasswd", "sasl_passwd", "sasl_passwd.db", "ldap.secret",
              "pam_ldap.secret", "ceph.client.admin.keyring", "rsyncd.secrets", "chrony.keys",
              "rndc.key", "msmtprc", "passwd.client", "iscsid.conf")


def is_deny_file(path: str) -> bool:
    """Whether the denied default `path` is a file (by its name; davfs2's `secrets` by its
    whole path, libvirt's being a directory)."""
    return os.path.basename(path) in DENY_FILES or path.endswith("/davfs2/secrets")
ENV_PASS_DEFAULTS = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "USER")
WINDOWS_SYSTEM_READ = ("C:\\Windows", "?C:\\Program Files", "?C:\\Program Files (x86)")
WINDOWS_DENY_DEFAULTS = (
    *(path for path in DENY_DEFAULTS if path.startswith("{home}/")),
    "{home}/_netrc", "{home}/AppData/Roaming/gcloud", "{home}/AppData/Roaming/GitHub CLI",
)
# What most Windows programs need and none of which is a secret: the program search, the system's
# own places (cmd.exe is ComSpec), the user's profile folder (as HOME is passed on Linux; the
# sandbox reads it only where a root grants it), the processor. TEMP and TMP are not the user's:
# the backend gives each launch its AppContainer's own temp folder (docs/windows.md).
WINDOWS_ENV_PASS_DEFAULTS = (*ENV_PASS_DEFAULTS, "PATHEXT", "SystemRoot", "SystemDrive",
                             "windir", "ComSpec", "USERPROFILE", "PROCESSOR_ARCHITECTURE",
                             "NUMBER_OF_PROCESSORS")
REGISTRIES = (
    "pypi.org", "files.pythonhosted.org",
    "registry.npmjs.org", "registry.yarnpkg.com",
    "crates.io", "index.crates.io", "static.crates.io",
    "proxy.golang.org", "sum.golang.org",
    "repo.maven.apache.org", "repo1.maven.org",
    "rubygems.org",
    "*.debian.org", "*.ubuntu.com",
    "github.com", "codeload.github.com", "*.githubusercontent.com",
)

_INTERACTIVE_LIMITS = {
    "timeout": "10m", "memory": "2GiB", "pids": 512, "output": "16MiB", "file_size": "1GiB",
}
_BUILD_LIMITS = {
    "timeout": "30m", "memory": "4GiB", "pids": 1024, "output": "64MiB", "file_size": "4GiB",
}


def preset_documents(platform: str) -> dict[str, dict[str, Any]]:
    """The presets for `platform` (a `sys.platform` value)."""
    windows = platform == "win32"
    system = WINDOWS_SYSTEM_READ if windows else SYSTEM_READ

    def document(*, read: tuple[str, ...], write: tuple[str, ...], exec_from_write: bool,
                 limits: dict[str, Any], allow: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "version": 1,
            "filesystem": {
                "read": list(read),
                "write": list(write),
                "deny": list(WINDOWS_DENY_DEFAULTS if windows else DENY_DEFAULTS),
                "exec_from_write": exec_from_write,
                # (a writable preset's command gets a home of its own for caches and
                # configuration; not on Windows, whose tools read USERPROFILE and APPDATA)
                "home": "private" if write and not windows else "host",
            },
            "network": {"mode": "allowlist" if allow else "none", "allow": list(allow)},
            "env": {"pass": list(WINDOWS_ENV_PASS_DEFAULTS if windows else ENV_PASS_DEFAULTS)},
            "limits": {name: value for name, value in limits.items()
                       if not (windows and name == "file_size")},
        }

    return {
        "read-only": document(read=(*system, "{workspace}"), write=(), exec_from_write=False,
                              limits=_INTERACTIVE_LIMITS),
        "workspace-write": document(read=system, write=("{workspace}",), exec_from_write=True,
                                    limits=_INTERACTIVE_LIMITS),
        "workspace-write-no-exec": document(read=system, write=("{workspace}",),
                                            exec_from_write=False, limits=_INTERACTIVE_LIMITS),
        "offline-build": document(read=system, write=("{workspace}",), exec_from_write=True,
                                  limits=_BUILD_LIMITS),
        "networked-build": document(read=system, write=("{workspace}",), exec_from_write=True,
                                    limits=_BUILD_LIMITS, allow=REGISTRIES),
    }


PRESET_DOCUMENTS: dict[str, dict[str, Any]] = preset_documents(sys.platform)
PRESETS = tuple(PRESET_DOCUMENTS)
