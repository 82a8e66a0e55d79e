"""The `.wsb` configuration for a plan, rendered with xml.etree (every value escaped by it).

Everything a guest could use to reach the host other than the mapped folders and the agent's
network channel is switched off: the virtual GPU, audio and video input, printer and clipboard
redirection; ProtectedClient runs the guest's desktop session with extra hardening (the host's
remote-desktop client to it runs in an AppContainer). Networking is disabled for
`network.mode = "none"` (the agent's channel is then the spool in the rendezvous folder) and
enabled for "allowlist", whose guest reaches the host's proxy and the agent's TCP channel
through a firewall locked before any command runs (see wsb_bootstrap). The LogonCommand runs
the bootstrap from the read-only boot folder.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from stockade.errors import UnenforceableError
from stockade.vm.wsb_plan import GUEST_BOOT, Plan

BOOTSTRAP = "bootstrap.ps1"
LOGON_COMMAND = ("powershell.exe -NoLogo -NoProfile -NonInteractive -ExecutionPolicy Bypass "
                 f"-File {GUEST_BOOT}\\{BOOTSTRAP}")
DISABLED = ("vGPU", "AudioInput", "VideoInput", "PrinterRedirection", "ClipboardRedirection")
# Characters XML 1.0 cannot carry at all (ElementTree would write them unescaped).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def render(plan: Plan) -> str:
    """The configuration document as text."""
    root = ET.Element("Configuration")
    for name in DISABLED:
        _child(root, name, "Disable")
    _child(root, "ProtectedClient", "Enable")
    _child(root, "Networking", "Enable" if plan.networking else "Disable")
    if plan.memory_mb is not None:
        _child(root, "MemoryInMB", str(plan.memory_mb))
    folders = ET.SubElement(root, "MappedFolders")
    for mapping in plan.mappings:
        folder = ET.SubElement(folders, "MappedFolder")
        _child(folder, "HostFolder", mapping.host)
        _child(folder, "SandboxFolder", mapping.guest)
        _child(folder, "ReadOnly", "true" if mapping.read_only else "false")
    command = ET.SubElement(root, "LogonCommand")
    _child(command, "Command", LOGON_COMMAND)
    return ET.tostring(root, encoding="unicode")


def _child(parent: ET.Element, tag: str, text: str) -> None:
    if _NOT_XML.search(text):
        raise UnenforceableError("filesystem.path", f"{text[:80]!r} holds a character that an "
                                 "XML configuration cannot carry")
    ET.SubElement(parent, tag).text = text
