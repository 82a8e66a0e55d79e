"""The DACLs of stock Windows directories, as data, for the model volume of the tests
(test_windows_fakes.FakeTree.stock): what `icacls` lists, and `(Get-Acl PATH).Sddl` spells
exactly, on Windows 11 and Windows Server 2022 — the shape the backend meets on a real host.

Each entry is written as its SDDL ACE string, in the order icacls lists them, the icacls line
beside it. What matters in that shape:

- **split entries**: `C:\\Windows`, `C:\\Program Files` and `C:\\Users` give a trustee its
  rights on the directory itself in one entry without inheritance (`(RX)`) and what its
  contents get in a second, inherit-only one (`(OI)(CI)(IO)(GR,GE)`), never one inheritable
  `(OI)(CI)(RX)`; ALL APPLICATION PACKAGES and ALL RESTRICTED APPLICATION PACKAGES included;
- **generic rights**: the inherit-only entries hold GENERIC_READ | GENERIC_EXECUTE (GXGR) or
  GENERIC_ALL (GA, which icacls prints as `(F)`), mapped to file rights only where they become
  effective (acl.inherit);
- **inherited order**: a directory below one of them inherits, per entry, the mapped effective
  entry, then the inherit-only copy with the generic form (icacls: `(I)(RX)` then
  `(I)(OI)(CI)(IO)(GR,GE)`);
- the drive's root differs by edition: Windows 11 gives Authenticated Users modify on what is
  created below it (a generic entry, split again in each child); Server 2022 lets Users create
  folders and files (`(CI)(AD)`, `(CI)(IO)(WD)`) and gives CREATOR OWNER full control.

`C:\\hostedtoolcache` (where actions/setup-python puts the interpreter on the GitHub runners)
is not a stock directory: the runner image's build, as an administrator, creates it below the
drive's root, so its DACL is what that root's entries make of a new directory — derived here by
inheritance, not copied from a host (docs/windows.md says so).
"""

from __future__ import annotations

import re

from stockade.windows import sid as sids
from stockade.windows.acl import Ace

TRUSTED_INSTALLER = "S-1-5-80-956008885-3418522649-1831038044-1853292631-2271478464"
ALIASES = {"SY": "S-1-5-18", "BA": "S-1-5-32-544", "BU": "S-1-5-32-545", "AU": "S-1-5-11",
           "WD": "S-1-1-0", "CO": "S-1-3-0", "AC": sids.ALL_APP_PACKAGES}
RIGHTS = {"FA": 0x1F01FF, "GA": 0x10000000, "GR": 0x80000000, "GW": 0x40000000,
          "GX": 0x20000000, "SD": 0x10000, "DC": 0x2, "LC": 0x4}
FLAGS = {"OI": 0x1, "CI": 0x2, "NP": 0x4, "IO": 0x8, "ID": 0x10}
_ACE = re.compile(r"\(A;([A-Z]*);([A-Z]+|0x[0-9a-fA-F]+);;;([A-Z]{2}|S-[0-9-]+)\)")

_SYSTEM_DIRECTORY = (  # C:\Windows and C:\Program Files (the same on both editions)
    f"(A;;FA;;;{TRUSTED_INSTALLER})"           # NT SERVICE\TrustedInstaller:(F)
    f"(A;CIIO;GA;;;{TRUSTED_INSTALLER})"       # NT SERVICE\TrustedInstaller:(CI)(IO)(F)
    "(A;;0x1301bf;;;SY)"                       # NT AUTHORITY\SYSTEM:(M)
    "(A;OICIIO;GA;;;SY)"                       # NT AUTHORITY\SYSTEM:(OI)(CI)(IO)(F)
    "(A;;0x1301bf;;;BA)"                       # BUILTIN\Administrators:(M)
    "(A;OICIIO;GA;;;BA)"                       # BUILTIN\Administrators:(OI)(CI)(IO)(F)
    "(A;;0x1200a9;;;BU)"                       # BUILTIN\Users:(RX)
    "(A;OICIIO;GXGR;;;BU)"                     # BUILTIN\Users:(OI)(CI)(IO)(GR,GE)
    "(A;OICIIO;GA;;;CO)"                       # CREATOR OWNER:(OI)(CI)(IO)(F)
    "(A;;0x1200a9;;;AC)"                       # ALL APPLICATION PACKAGES:(RX)
    "(A;OICIIO;GXGR;;;AC)"                     # ALL APPLICATION PACKAGES:(OI)(CI)(IO)(GR,GE)
    "(A;;0x1200a9;;;S-1-15-2-2)"               # ALL RESTRICTED APPLICATION PACKAGES:(RX)
    "(A;OICIIO;GXGR;;;S-1-15-2-2)"             # ... :(OI)(CI)(IO)(GR,GE)
)

_USERS = (  # C:\Users
    "(A;OICI;FA;;;SY)"                         # NT AUTHORITY\SYSTEM:(OI)(CI)(F)
    "(A;OICI;FA;;;BA)"                         # BUILTIN\Administrators:(OI)(CI)(F)
    "(A;;0x1200a9;;;BU)"                       # BUILTIN\Users:(RX)
    "(A;OICIIO;GXGR;;;BU)"                     # BUILTIN\Users:(OI)(CI)(IO)(GR,GE)
    "(A;;0x1200a9;;;WD)"                       # Everyone:(RX)
    "(A;OICIIO;GXGR;;;WD)"                     # Everyone:(OI)(CI)(IO)(GR,GE)
)

# Each edition: path -> (protected, the explicit entries). A user profile is added by
# `profile()`; everything else on the model volume inherits.
STOCK = {
    "windows11": {
        "C:\\": (True,
                 "(A;OICI;FA;;;BA)"            # BUILTIN\Administrators:(OI)(CI)(F)
                 "(A;OICI;FA;;;SY)"            # NT AUTHORITY\SYSTEM:(OI)(CI)(F)
                 "(A;OICI;0x1200a9;;;BU)"      # BUILTIN\Users:(OI)(CI)(RX)
                 "(A;OICIIO;SDGXGWGR;;;AU)"    # NT AUTHORITY\Authenticated Users:(OI)(CI)(IO)(M)
                 "(A;;LC;;;AU)"),              # NT AUTHORITY\Authenticated Users:(AD)
        "C:\\Windows": (True, _SYSTEM_DIRECTORY),
        "C:\\Program Files": (True, _SYSTEM_DIRECTORY),
        "C:\\Users": (True, _USERS),
    },
    "server2022": {
        "C:\\": (True,
                 "(A;OICI;FA;;;SY)"            # NT AUTHORITY\SYSTEM:(OI)(CI)(F)
                 "(A;OICI;FA;;;BA)"            # BUILTIN\Administrators:(OI)(CI)(F)
                 "(A;OICI;0x1200a9;;;BU)"      # BUILTIN\Users:(OI)(CI)(RX)
                 "(A;CI;LC;;;BU)"              # BUILTIN\Users:(CI)(AD)
                 "(A;CIIO;DC;;;BU)"            # BUILTIN\Users:(CI)(IO)(WD)
                 "(A;OICIIO;GA;;;CO)"),        # CREATOR OWNER:(OI)(CI)(IO)(F)
        "C:\\Windows": (True, _SYSTEM_DIRECTORY),
        "C:\\Program Files": (True, _SYSTEM_DIRECTORY),
        "C:\\Users": (True, _USERS),
    },
}
EDITIONS = tuple(STOCK)


def profile(user: str) -> tuple[bool, str]:
    """A user profile, C:\\Users\\NAME (both editions): protected, full control for SYSTEM,
    Administrators and the user, inherited by everything in it."""
    return True, f"(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)(A;OICI;FA;;;{user})"


def aces(sddl: str) -> tuple[Ace, ...]:
    """The allow entries an SDDL ACE string list spells (only the forms above)."""
    out, end = [], 0
    for match in _ACE.finditer(sddl):
        if match.start() != end:
            raise ValueError(f"not an ACE at {sddl[end:end + 40]!r}")
        end = match.end()
        flags_text, rights, trustee = match.groups()
        flags = sum(FLAGS[flags_text[i:i + 2]] for i in range(0, len(flags_text), 2))
        mask = int(rights, 16) if rights.startswith("0x") else sum(
            RIGHTS[rights[i:i + 2]] for i in range(0, len(rights), 2))
        out.append(Ace.allow(ALIASES.get(trustee, trustee), mask, flags))
    if end != len(sddl):
        raise ValueError(f"not an ACE at {sddl[end:end + 40]!r}")
    return tuple(out)
