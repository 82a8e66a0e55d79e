"""DACLs on the Windows filesystem, read and written by path (GetNamedSecurityInfoW /
SetNamedSecurityInfoW), as grants.py's AclStore.

Only explicit entries are ever written: SetNamedSecurityInfoW derives the inherited ones from
the parent (unless the DACL is protected) and propagates the change to everything below a
directory, which is what makes an inheritable grant reach a whole root.
"""

from __future__ import annotations

import ctypes

from stockade.windows import acl, fsinfo
from stockade.windows import constants as c
from stockade.windows.acl import Ace, Dacl
from stockade.windows.api import win32
from stockade.windows.structs import DWORD, PVOID, WORD


class WindowsAclStore:
    def read(self, path: str) -> Dacl:
        api = win32()
        dacl, descriptor = PVOID(), PVOID()
        api.GetNamedSecurityInfoW(path, c.SE_FILE_OBJECT, c.DACL_SECURITY_INFORMATION,
                                  None, None, ctypes.byref(dacl), None,
                                  ctypes.byref(descriptor))
        try:
            if not dacl.value:
                raise OSError(None, f"{path} has no DACL (everyone has full access); "
                                    "Stockade will not change it")
            control, revision = WORD(), DWORD()
            api.GetSecurityDescriptorControl(descriptor, ctypes.byref(control),
                                             ctypes.byref(revision))
            return Dacl(aces_at(dacl.value), bool(control.value & c.SE_DACL_PROTECTED))
        finally:
            api.LocalFree(descriptor)

    def write(self, path: str, explicit: tuple[Ace, ...], protected: bool) -> None:
        data = ctypes.create_string_buffer(acl.encode(explicit))
        flags = c.DACL_SECURITY_INFORMATION | (c.PROTECTED_DACL_SECURITY_INFORMATION if protected
                                               else c.UNPROTECTED_DACL_SECURITY_INFORMATION)
        win32().SetNamedSecurityInfoW(path, c.SE_FILE_OBJECT, flags, None, None, data, None)

    def identity(self, path: str) -> str:
        return fsinfo.identity(path)


def aces_at(address: int) -> tuple[Ace, ...]:
    """The entries of the binary ACL at `address` (its size is in its header)."""
    size = int.from_bytes(ctypes.string_at(address + 2, 2), "little")
    return acl.decode(ctypes.string_at(address, size))
