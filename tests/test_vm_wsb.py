"""The Windows Sandbox driver (stockade/vm/wsb*.py), pure logic on any host: the plan and its
`.wsb` document read back field by field and checked against the elements Microsoft documents,
refused paths and policies, the guest's bootstrap (network check, firewall lock and its
verification, the command user, before the agent), the rendezvous parser (fuzzed), the
launcher choice, the host lease held by a real second process, the proxy's listener, and the
non-Windows refusal.

The rendezvous and the channel run for real, over loopback TCP and over the spool: the guest
entry (the `guest.py` the bootstrap starts, with POSIX processes standing for the command
user's Jobs: tests/wsb_guests.py) in a child process with the Windows agent, the host's
`attach` and a Sandbox on top. Enforcement (mappings, firewall, the command user) needs
Windows: docs/windows-sandbox.md. The daemon: tests/test_vm_wsb_daemon.py; the agent:
tests/test_vm_wsb_agent.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.errors import SetupError, UnavailableError, UnenforceableError
from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.policy.model import HttpRule
from stockade.session import boot
from stockade.session.errors import SessionError
from stockade.session.exchange import Output
from stockade.session.sandbox import Sandbox
from stockade.vm import (
    wsb,
    wsb_bootstrap,
    wsb_config,
    wsb_launcher,
    wsb_lock,
    wsb_plan,
    wsb_spool,
)
from stockade.vm import wsb_rendezvous as rz

BOOT_ID = "0123456789abcdef0123456789abcdef"
BOOT_DIR = "C:\\Users\\me\\state\\wsb\\b\\boot"
RENDEZVOUS_DIR = "C:\\Users\\me\\state\\wsb\\b\\rendezvous"
PYTHON = "C:\\Python312\\python.exe"
PACKAGE = "C:\\src\\stockade"
REPO = os.path.dirname(boot.PACKAGE_DIR)
TESTS = os.path.dirname(os.path.abspath(__file__))


def _grants(*paths: str) -> tuple[PathGrant, ...]:
    return tuple(PathGrant(p, p) for p in paths)


def _request(**changes) -> LaunchRequest:
    fields = {"argv": (PYTHON,), "cwd": "C:\\ws", "env": (),
              "read": _grants("C:\\Windows", "C:\\Program Files", "C:\\Python312", PACKAGE),
              "write": _grants("C:\\ws"), "exec_from_write": True,
              "protected": (".git",), "limits": LimitSpec(memory=4 << 30, pids=512)}
    return LaunchRequest(**(fields | changes))


def _view(kinds: dict[str, str] | None = None,
          found: dict[str, list[tuple[str, bool]]] | None = None) -> wsb_plan.HostView:
    return wsb_plan.HostView(lambda path: (kinds or {}).get(path),
                             lambda root, names: (found or {}).get(root, []))


def _plan(request: LaunchRequest | None = None, view: wsb_plan.HostView | None = None,
          proxy_port: int | None = None) -> wsb_plan.Plan:
    return wsb_plan.plan(request or _request(), boot_dir=BOOT_DIR, rendezvous_dir=RENDEZVOUS_DIR,
                         boot_id=BOOT_ID, view=view or _view(), proxy_port=proxy_port)


# The elements of a Windows Sandbox configuration as Microsoft documents them ("Use and
# configure Windows Sandbox", learn.microsoft.com/windows/security/application-security/
# application-isolation/windows-sandbox/windows-sandbox-configure-using-wsb-file): each element
# with the values it takes (None: text of its own kind), and the children of the compound ones.
WSB_SCHEMA: dict[str, tuple[str, ...] | None] = {
    "vGPU": ("Enable", "Disable", "Default"), "Networking": ("Enable", "Disable", "Default"),
    "AudioInput": ("Enable", "Disable", "Default"), "VideoInput": ("Enable", "Disable", "Default"),
    "ProtectedClient": ("Enable", "Disable", "Default"),
    "PrinterRedirection": ("Enable", "Disable", "Default"),
    "ClipboardRedirection": ("Disable", "Default"), "MemoryInMB": None,
    "MappedFolders": None, "LogonCommand": None,
}
WSB_CHILDREN = {"MappedFolders": {"MappedFolder"},
                "MappedFolder": {"HostFolder", "SandboxFolder", "ReadOnly"},
                "LogonCommand": {"Command"}}
WSB_BOOLEANS = ("true", "false")


def _check_schema(document: str) -> ET.Element:
    """The document, once each element and value is one Microsoft documents."""
    root = ET.fromstring(document)
    assert root.tag == "Configuration" and not root.attrib
    assert len({child.tag for child in root}) == len(root)  # each element once
    for child in root:
        assert child.tag in WSB_SCHEMA, child.tag
        values = WSB_SCHEMA[child.tag]
        if values is not None:
            assert child.text in values and not len(child), (child.tag, child.text)
        elif child.tag == "MemoryInMB":
            assert child.text.isdigit() and int(child.text) > 0
        else:
            for element in child.iter():
                if element is not child:
                    parent = {e: p for p in child.iter() for e in p}[element]
                    assert element.tag in WSB_CHILDREN[parent.tag], element.tag
            for folder in child.iter("MappedFolder"):
                assert folder.findtext("ReadOnly") in WSB_BOOLEANS
                assert folder.findtext("HostFolder") and folder.findtext("SandboxFolder")
    return root


def _folders(document: str) -> list[tuple[str, str, str]]:
    root = ET.fromstring(document)
    return [(f.findtext("HostFolder"), f.findtext("SandboxFolder"), f.findtext("ReadOnly"))
            for f in root.find("MappedFolders")]


# --- the configuration ----------------------------------------------------------------------------

def test_the_configuration_read_back_field_by_field():
    view = _view({"C:\\ws\\secrets": "dir"}, {"C:\\ws": [("C:\\ws\\.git", True)]})
    plan = _plan(_request(deny=_grants("C:\\ws\\secrets", "C:\\Users\\me\\.ssh")), view)
    root = _check_schema(wsb_config.render(plan))
    for name in ("vGPU", "AudioInput", "VideoInput", "PrinterRedirection",
                 "ClipboardRedirection"):
        assert root.findtext(name) == "Disable"
    assert root.findtext("ProtectedClient") == "Enable"
    assert root.findtext("Networking") == "Disable"  # none: no network at all (the spool)
    assert root.findtext("MemoryInMB") == "4096"
    assert root.find("LogonCommand").findtext("Command") == (
        "powershell.exe -NoLogo -NoProfile -NonInteractive -ExecutionPolicy Bypass "
        "-File C:\\stockade\\boot\\bootstrap.ps1")
    assert _folders(wsb_config.render(plan)) == [
        (BOOT_DIR, "C:\\stockade\\boot", "true"),
        (RENDEZVOUS_DIR, "C:\\stockade\\rendezvous", "false"),
        ("C:\\Python312", "C:\\Python312", "true"),  # outer folders before nested ones
        ("C:\\ws", "C:\\ws", "false"),
        ("C:\\src\\stockade", "C:\\src\\stockade", "true"),
        ("C:\\ws\\.git", "C:\\ws\\.git", "true"),  # protected: mapped read-only over itself
        (BOOT_DIR + "\\mask\\0", "C:\\ws\\secrets", "true"),  # denied: an empty folder over it
    ]
    # The guest image's own roots are not mapped; a denied path outside every root needs nothing.
    assert plan.read_only == ("C:\\stockade\\boot", "C:\\Python312", "C:\\src\\stockade",
                              "C:\\ws\\.git")
    assert [m.guest for m in plan.masks] == ["C:\\ws\\secrets"]


def test_nested_roots_fold_or_nest():
    request = _request(read=_grants("C:\\data", "C:\\data\\sub", "C:\\ws\\vendor"),
                       write=_grants("C:\\ws", "C:\\data\\out"), protected=())
    assert [(m.host, m.read_only) for m in _plan(request).mappings[2:]] == [
        ("C:\\data", True), ("C:\\ws", False), ("C:\\data\\out", False),
        ("C:\\ws\\vendor", True)]


def test_an_exact_write_grant_overrides_a_protected_name():
    request = _request(write=_grants("C:\\ws", "C:\\ws\\.git"))
    plan = _plan(request, _view(found={"C:\\ws": [("C:\\ws\\.git", True)]}))
    assert ("C:\\ws\\.git", False) in [(m.host, m.read_only) for m in plan.mappings]
    assert "C:\\ws\\.git" not in plan.read_only


def test_xml_escapes_what_a_path_may_hold():
    request = _request(write=_grants("C:\\a&b 'q' \u00e9"), protected=())
    document = wsb_config.render(_plan(request))
    assert "&amp;" in document
    assert ("C:\\a&b 'q' \u00e9", "C:\\a&b 'q' \u00e9", "false") in _folders(document)


@pytest.mark.parametrize("path", [
    "\\\\server\\share\\x", "\\\\?\\C:\\x", "\\\\.\\pipe\\x", "\\??\\C:\\x", "relative\\x",
    "D:\\data", "C:\\", "C:\\stockade\\boot", "C:\\Users\\WDAGUtilityAccount\\x",
    "C:\\x\\file.txt:stream", "C:\\x\\NUL", "C:\\x\\trailing.", "C:\\PROGRA~2\\x", "C:/x",
    "C:\\x\\..\\y"])
def test_paths_that_cannot_be_mapped_are_refused(path):
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(write=_grants(path), protected=()))
    assert info.value.code == "unenforceable:filesystem.path"


def test_writing_the_guest_image_is_refused():
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(write=_grants("C:\\Windows\\Temp")))
    assert info.value.code == "unenforceable:filesystem.path"


@pytest.mark.parametrize("kinds, deny, code", [
    ({"C:\\ws\\key.pem": "file"}, "C:\\ws\\key.pem", "unenforceable:filesystem.deny"),
    ({}, "C:\\Windows\\System32\\config", "unenforceable:filesystem.deny"),
])
def test_denials_that_cannot_be_covered_are_refused(kinds, deny, code):
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(deny=_grants(deny)), _view(kinds))
    assert info.value.code == code


def test_a_denied_path_that_does_not_exist_needs_no_mask():
    assert _plan(_request(deny=_grants("C:\\ws\\later"))).masks == ()


def test_a_protected_file_is_refused():
    view = _view(found={"C:\\ws": [("C:\\ws\\sub\\.git", False)]})
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(), view)
    assert info.value.code == "unenforceable:filesystem.protected"


def test_too_many_folders_are_refused():
    found = {"C:\\ws": [(f"C:\\ws\\p{i}\\.git", True) for i in range(wsb_plan.MAX_MAPPINGS)]}
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(), _view(found=found))
    assert info.value.code == "unenforceable:filesystem"


@pytest.mark.parametrize("limits, exec_from_write, code", [
    (LimitSpec(memory=1 << 30), True, "unenforceable:limits.memory"),
    (LimitSpec(cpu=0.5), True, "unenforceable:limits.cpu"),
    (LimitSpec(file_size=1 << 20), True, "unenforceable:limits.file_size"),
    (LimitSpec(), False, "unenforceable:filesystem.exec_from_write"),
])
def test_limits_and_exec_the_guest_cannot_enforce_are_refused(limits, exec_from_write, code):
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(limits=limits, exec_from_write=exec_from_write))
    assert info.value.code == code


def test_without_memory_limit_the_default_is_left_alone():
    plan = _plan(_request(limits=LimitSpec()))
    assert ET.fromstring(wsb_config.render(plan)).find("MemoryInMB") is None


@pytest.mark.parametrize("network, port, code", [
    (NetworkSpec(mode="any"), None, "unenforceable:network.any"),
    (NetworkSpec(mode="allowlist"), None, "unenforceable:network.allowlist"),
    (NetworkSpec(mode="none"), 3128, "unenforceable:network.none"),
    (NetworkSpec(mode="allowlist", http=(HttpRule("example.com", ("GET",), ("/",)),)), 3128,
     "unenforceable:network.credentials"),
])
def test_network_the_driver_refuses(network, port, code):
    with pytest.raises(UnenforceableError) as info:
        _plan(_request(network=network), proxy_port=port)
    assert info.value.code == code


def test_none_is_a_guest_without_a_network_allowlist_one_with():
    assert not _plan().networking
    plan = _plan(_request(network=NetworkSpec(mode="allowlist", allow=("pypi.org",))),
                 proxy_port=3128)
    assert plan.networking
    assert _check_schema(wsb_config.render(plan)).findtext("Networking") == "Enable"


def test_a_plans_shape_is_what_its_guest_offers_whatever_the_boot():
    view = _view({"C:\\ws\\secrets": "dir"}, {"C:\\ws": [("C:\\ws\\.git", True)]})
    request = _request(deny=_grants("C:\\ws\\secrets"))
    one = _plan(request, view)
    other = wsb_plan.plan(request, boot_dir="C:\\elsewhere\\boot", rendezvous_dir="C:\\r",
                          boot_id="f" * 32, view=view)
    assert one.shape() == other.shape()
    assert _plan(request).shape() != one.shape()  # (the .git it found, the mask it made)
    assert _plan(_request(limits=LimitSpec(memory=4 << 30, pids=7)), view).shape() != \
        _plan(_request(), view).shape()


# --- the bootstrap --------------------------------------------------------------------------------

def _script(plan: wsb_plan.Plan) -> str:
    return wsb_bootstrap.script(plan, PYTHON, PACKAGE)


def _allowlist(**changes) -> wsb_plan.Plan:
    return _plan(_request(network=NetworkSpec(mode="allowlist", allow=("pypi.org",)),
                          **changes), proxy_port=3128)


def test_the_firewall_is_locked_and_verified_before_the_agent_starts():
    text = _script(_allowlist())
    order = [text.index(step) for step in (
        "Get-NetRoute -AddressFamily IPv4 -DestinationPrefix '0.0.0.0/0'",
        "Set-NetFirewallProfile -All -Enabled True -DefaultInboundAction Block "
        "-DefaultOutboundAction Block",
        "Get-NetFirewallRule | Remove-NetFirewallRule",
        "New-NetFirewallRule -Name 'stockade-agent'",
        "Get-NetFirewallProfile -PolicyStore ActiveStore",
        "Refuse 'firewall_unverified' \"unexpected allow rules",
        "Check-Rule 'stockade-agent' 'Inbound' 'TCP' '47470' 'Any' $HostAddress",
        "Resolve-DnsName",
        "ConnectAsync($HostAddress, 53)",
        "Refuse 'filesystem_unverified'",
        "New-LocalUser -Name 'stockade-cmd'",
        "Refuse 'command_user_unverified'",
        f"$Password | & '{PYTHON}' -I -S -B 'C:\\stockade\\boot\\guest.py' '{PACKAGE}' "
        "$Rendezvous $BootId '512' 'tcp' $HostAddress 47470",
    )]
    assert order == sorted(order)
    assert text.count("New-NetFirewallRule") == 3  # the agent's inbound port, the proxy, DHCP
    assert "-Direction Inbound -Action Allow -Protocol TCP -LocalPort 47470 -RemotePort Any " \
           "-RemoteAddress $HostAddress" in text
    assert "-Service 'Dhcp'" in text
    assert "$expected = @('stockade-agent', 'stockade-proxy', 'stockade-dhcp')" in text
    assert "$ErrorActionPreference = 'Stop'" in text


def test_allowlist_opens_only_the_host_proxy_port():
    text = _script(_allowlist())
    assert "-Name 'stockade-proxy' -DisplayName 'stockade-proxy' -Direction Outbound -Action " \
           "Allow -Protocol TCP -LocalPort Any -RemotePort 3128 -RemoteAddress $HostAddress" in text
    assert "Check-Rule 'stockade-proxy' 'Outbound' 'TCP' 'Any' '3128' $HostAddress" in text
    assert [r[0] for r in wsb_bootstrap.rules(_allowlist())] == [
        "stockade-agent", "stockade-proxy", "stockade-dhcp"]


def test_a_guest_without_a_network_checks_it_has_none_and_allows_nothing():
    text = _script(_plan())
    assert "Get-NetRoute" not in text and "$HostAddress" not in text
    assert text.index("Get-NetIPAddress -AddressFamily IPv4") < text.index(
        "Set-NetFirewallProfile -All -Enabled True -DefaultInboundAction Block "
        "-DefaultOutboundAction Block")
    assert "Refuse 'guest_network'" in text
    assert "New-NetFirewallRule" not in text and "$expected = @()" in text  # locked, no rule
    assert wsb_bootstrap.rules(_plan()) == []
    assert text.rstrip().splitlines()[-5].endswith("$Rendezvous $BootId '512' 'spool'")


def test_the_command_user_is_standard_and_verified_before_the_agent():
    text = _script(_plan(_request(limits=LimitSpec())))
    assert "Add-LocalGroupMember -SID 'S-1-5-32-545' -Member $user" in text
    for group in ("S-1-5-32-544", "S-1-5-32-551", "S-1-5-32-547", "S-1-5-32-549",
                  "S-1-5-32-556"):
        assert f"'{group}'" in text.split("$privileged = @(")[1].split(")")[0]
    assert "Get-LocalGroupMember -Group $group | Where-Object { $_.SID -eq $user.SID }" in text
    assert "[Security.Cryptography.RandomNumberGenerator]::Create().GetBytes($bytes)" in text
    assert "$BootId '-' 'spool'" in text  # no pids limit: `-`
    assert text.index("Refuse 'command_user_unverified'") < text.index("$Password | &")


def test_every_read_only_mapping_and_mask_is_verified_in_the_guest():
    view = _view({"C:\\ws\\secrets": "dir"}, {"C:\\ws": [("C:\\ws\\.git", True)]})
    plan = _plan(_request(deny=_grants("C:\\ws\\secrets")), view)
    text = _script(plan)
    for path in plan.read_only:
        assert f"$path = '{path}'" in text
    assert "Get-ChildItem -LiteralPath 'C:\\ws\\secrets' -Force" in text
    assert f"'stockade-masked-{BOOT_ID}'" in text
    assert text.index("'C:\\ws\\secrets is not masked'") < text.index("guest.py")


def test_powershell_literals_double_every_kind_of_quote():
    assert wsb_bootstrap.ps("C:\\it's") == "'C:\\it''s'"
    assert wsb_bootstrap.ps("a\u2019b\u2018c") == "'a\u2019\u2019b\u2018\u2018c'"
    with pytest.raises(UnenforceableError):
        wsb_bootstrap.ps("a\nb")


def test_the_script_is_utf8_with_a_byte_order_mark():
    data = wsb_bootstrap.encode_script(_script(_plan(_request(read=_grants("C:\\\u00e9")))))
    assert data.startswith(b"\xef\xbb\xbf") and "C:\\\u00e9".encode() in data
    assert data.count(b"\r\n") == data.count(b"\n")


# --- the rendezvous -------------------------------------------------------------------------------

SECRET = bytes(range(32))


def _ready(**changes) -> dict:
    body = {"version": 2, "status": "ready", "boot": BOOT_ID, "transport": "tcp",
            "address": "172.20.1.5", "port": 47470, "host": "172.20.1.1",
            "proof": rz.proof(SECRET, BOOT_ID, "tcp", "172.20.1.5", 47470, "172.20.1.1")}
    return body | changes


def _spool(**changes) -> dict:
    return {"version": 2, "status": "ready", "boot": BOOT_ID, "transport": "spool",
            "proof": rz.proof(SECRET, BOOT_ID, "spool")} | changes


def test_a_ready_record_round_trips_and_verifies():
    record = rz.parse(json.dumps(_ready()).encode())
    assert record == rz.Ready(BOOT_ID, "tcp", _ready()["proof"], "172.20.1.5", 47470,
                              "172.20.1.1")
    assert rz.parse(rz.encode(record)) == record
    rz.verify(record, SECRET, BOOT_ID)
    spool = rz.parse(json.dumps(_spool()).encode())
    assert spool == rz.Ready(BOOT_ID, "spool", _spool()["proof"])
    rz.verify(spool, SECRET, BOOT_ID)
    with pytest.raises(rz.RendezvousError):  # (the proof covers the transport and endpoints)
        rz.verify(rz.Ready(BOOT_ID, "spool", _ready()["proof"]), SECRET, BOOT_ID)
    with pytest.raises(rz.RendezvousError):
        rz.verify(replace(record, host="172.20.1.9"), SECRET, BOOT_ID)
    assert SECRET.hex() not in rz.encode(record).decode()
    with pytest.raises(rz.RendezvousError) as info:
        rz.verify(record, bytes(32), BOOT_ID)
    assert info.value.code == "rendezvous_proof_invalid"
    with pytest.raises(rz.RendezvousError) as info:
        rz.verify(record, SECRET, "f" * 32)
    assert info.value.code == "rendezvous_stale"


def test_a_refusal_round_trips():
    record = rz.Refused(BOOT_ID, "firewall_unverified", "profile Public is not locked")
    assert rz.parse(rz.encode(record)) == record


@pytest.mark.parametrize("data", [
    json.dumps(_ready(extra=1)), json.dumps({k: v for k, v in _ready().items() if k != "proof"}),
    json.dumps(_ready(port=True)), json.dumps(_ready(port="47470")), json.dumps(_ready(port=0)),
    json.dumps(_ready(port=65536)), json.dumps(_ready(version=2.0)),
    json.dumps(_ready(version=1)), json.dumps(_ready(address="172.20.1.05")),
    json.dumps(_ready(host="0.0.0.0")), json.dumps(_ready(transport="udp")),
    json.dumps(_ready(transport=["tcp"])), json.dumps(_spool(address="172.20.1.5")),
    json.dumps({k: v for k, v in _ready().items() if k != "transport"}),
    json.dumps({k: v for k, v in _ready().items() if k != "host"}),
    json.dumps(_ready(address="0.0.0.0")), json.dumps(_ready(address="::1")),
    json.dumps(_ready(address="224.0.0.1")), json.dumps(_ready(boot=BOOT_ID.upper())),
    json.dumps(_ready(proof="00")), json.dumps(_ready(status="READY")), "[]", "",
    '{"version": 1, "version": 1}', '{"version": NaN}', "\xff", "x" * (rz.MAX_SIZE + 1),
    json.dumps({"version": 2, "status": "refused", "boot": BOOT_ID, "code": "Bad Code",
                "message": ""}),
    json.dumps({"version": 2, "status": "refused", "boot": BOOT_ID, "code": "x",
                "message": "m" * (rz.MAX_MESSAGE + 1)}),
    json.dumps({"version": 2, "status": "refused", "boot": BOOT_ID, "code": "x",
                "message": "", "transport": "tcp"}),
    "[" * 100000,
])
def test_malformed_rendezvous_records_are_refused(data):
    with pytest.raises(rz.RendezvousError) as info:
        rz.parse(data.encode("utf-8", "surrogateescape") if data != "\xff" else b"\xff")
    assert info.value.code == "rendezvous_invalid"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_fuzzed_bytes_give_a_record_or_a_typed_error(data):
    try:
        record = rz.parse(data)
    except rz.RendezvousError:
        return
    assert isinstance(record, rz.Ready | rz.Refused)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_ready()) + ["code", "message", "x"]),
                       _json_values, max_size=8), st.sampled_from(["refused", "tcp", "spool"]))
def test_fuzzed_records_give_a_record_or_a_typed_error(changes, kind):
    base = {"refused": {"version": 2, "status": "refused", "boot": BOOT_ID, "code": "c",
                        "message": ""}, "tcp": _ready(), "spool": _spool()}[kind]
    try:
        record = rz.parse(json.dumps(base | changes, allow_nan=True).encode())
    except rz.RendezvousError:
        return
    assert isinstance(record, rz.Ready | rz.Refused)


# --- the launcher ---------------------------------------------------------------------------------

SYSTEM32 = "C:\\Windows\\System32"


@pytest.mark.parametrize("on_path, in_system32, expected", [
    ({"wsb": "C:\\bin\\wsb.exe", "WindowsSandbox": "C:\\bin\\WindowsSandbox.exe"}, set(),
     ("wsb", "C:\\bin\\wsb.exe")),
    ({}, {SYSTEM32 + "\\wsb.exe", SYSTEM32 + "\\WindowsSandbox.exe"},
     ("wsb", SYSTEM32 + "\\wsb.exe")),
    ({"WindowsSandbox": "C:\\bin\\WindowsSandbox.exe"}, set(),
     ("exe", "C:\\bin\\WindowsSandbox.exe")),
    ({}, {SYSTEM32 + "\\WindowsSandbox.exe"}, ("exe", SYSTEM32 + "\\WindowsSandbox.exe")),
])
def test_the_launcher_is_chosen_from_what_is_found(on_path, in_system32, expected):
    launcher = wsb_launcher.choose(on_path.get, in_system32.__contains__, SYSTEM32)
    assert (launcher.kind, launcher.program) == expected


def test_no_windows_sandbox_is_unavailable():
    with pytest.raises(UnavailableError) as info:
        wsb_launcher.choose(lambda name: None, lambda path: False, SYSTEM32)
    assert info.value.code == "windows_sandbox_unavailable"


def test_launcher_command_lines():
    cli = wsb_launcher.Launcher("wsb", "wsb.exe")
    assert cli.start("ID", "<Configuration/>", "C:\\b\\s.wsb") == [
        "wsb.exe", "start", "--id", "ID", "--config", "<Configuration/>"]
    assert cli.stop("ID") == ["wsb.exe", "stop", "--id", "ID"]
    exe = wsb_launcher.Launcher("exe", "WindowsSandbox.exe")
    assert exe.start("ID", "<Configuration/>", "C:\\b\\s.wsb") == [
        "WindowsSandbox.exe", "C:\\b\\s.wsb"]
    assert exe.stop("ID") is None
    with pytest.raises(UnenforceableError):
        cli.start("ID", "x" * wsb_launcher.MAX_COMMAND_LINE, "C:\\b\\s.wsb")


# --- one sandbox per host -------------------------------------------------------------------------

def test_a_lease_held_by_another_process_is_busy(tmp_path):
    path = str(tmp_path / wsb_lock.LOCK_FILE)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from stockade.vm import wsb_lock; "
         "held = wsb_lock.acquire(sys.argv[1]); print('held', flush=True); sys.stdin.read()",
         path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": REPO})
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(SessionError) as info:
            wsb_lock.acquire(path)
        assert info.value.code == "busy"
    finally:
        holder.stdin.close()
        holder.wait(10)
    wsb_lock.acquire(path).release()  # the kernel dropped the holder's lease with it


def test_the_lease_is_exclusive_within_a_process_too(tmp_path):
    path = str(tmp_path / wsb_lock.LOCK_FILE)
    held = wsb_lock.acquire(path)
    with pytest.raises(SessionError):
        wsb_lock.acquire(path)
    held.release()
    held.release()
    wsb_lock.acquire(path).release()


# --- the non-Windows refusal ----------------------------------------------------------------------

@pytest.mark.not_windows  # (the refusal is for other hosts)
def test_windows_sandbox_refuses_off_windows_before_anything(tmp_path):
    with pytest.raises(UnavailableError) as info:
        wsb.WindowsSandbox(tmp_path / "no-such-policy.toml")  # not even read
    assert info.value.code == "windows_sandbox_unavailable"


# --- the rendezvous and the channel, for real ---------------------------------------------------

class _GuestHandle:
    """The guest entry's process, as a Sandbox handle."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def network_records(self) -> list[dict]:
        return []  # (no egress proxy here)

    def refusals(self) -> list:
        return []  # (nothing in the guest reports them: docs/vm.md)


# The bootstrap's guest entry, with POSIX processes standing for the command user's Jobs.
_CALL = "from stockade.vm.wsb_guest import main\nsys.exit(main(sys.argv[2:]))\n"
TEST_ENTRY = wsb_bootstrap.GUEST_PY.replace(_CALL, (
    f"sys.path.insert(0, {TESTS!r})\nfrom wsb_guests import posix_spawner\n"
    "from stockade.vm.wsb_guest import main\nsys.exit(main(sys.argv[2:], posix_spawner))\n"))


def _guest(rendezvous, secret: bytes | None = SECRET, transport: str = "tcp",
           password: bytes = b"pw\n") -> subprocess.Popen:
    """The guest entry as the bootstrap starts it, with loopback as the host's address."""
    assert TEST_ENTRY != wsb_bootstrap.GUEST_PY
    if secret is not None:
        (rendezvous / rz.SECRET_FILE).write_bytes(secret)
    if transport == rz.SPOOL:
        wsb_spool.create(str(rendezvous))
    entry = rendezvous.parent / wsb_bootstrap.GUEST_ENTRY
    entry.write_text(TEST_ENTRY)
    endpoint = ["127.0.0.1", "0"] if transport == rz.TCP else []
    process = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(entry), boot.PACKAGE_DIR,
                                str(rendezvous), BOOT_ID, "-", transport, *endpoint],
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdin.write(password)
    process.stdin.close()
    return process


class _LoopbackSandbox(Sandbox):
    containment = "windows-sandbox-loopback"

    def __init__(self, *, rendezvous, process: subprocess.Popen, networking: bool) -> None:
        self._rendezvous, self._process, self._networking = rendezvous, process, networking
        super().__init__(preset="read-only", workspace=rendezvous)

    def _boot(self, policy, ctx) -> boot.Session:
        channel, hello, _ = wsb.attach(str(self._rendezvous), SECRET, BOOT_ID, 30,
                                       lambda: self._process.poll() is None,
                                       networking=self._networking)
        return boot.Session(boot.agent_request(policy, ctx), _GuestHandle(self._process),
                            channel, hello)  # type: ignore[arg-type]


@pytest.fixture
def rendezvous(tmp_path):
    path = tmp_path / "rendezvous"
    path.mkdir()
    return path


@pytest.mark.not_windows  # (POSIX processes stand for the command user's Jobs)
@pytest.mark.parametrize("transport", [rz.TCP, rz.SPOOL])
def test_a_session_over_the_rendezvous_streams_output(rendezvous, transport):
    process = _guest(rendezvous, transport=transport)
    with _LoopbackSandbox(rendezvous=rendezvous, process=process,
                          networking=transport == rz.TCP) as sb:
        assert not (rendezvous / rz.SECRET_FILE).exists()  # taken before the agent served
        published = (rendezvous / rz.RENDEZVOUS_FILE).read_bytes()
        assert SECRET.hex().encode() not in published and SECRET not in published
        assert rz.parse(published).transport == transport
        assert "windows-sandbox" in sb.enforced["agent"]
        events = list(sb.stream(["sh", "-c", "echo one; sleep 0.2; echo two >&2"]))
        assert Output("stdout", b"one\n") in events and Output("stderr", b"two\n") in events
        result = events[-1]
        assert result.exit_code == 0 and result.stdout == b"one\n"
        assert sb.run(["cat"], input=b"in").stdout == b"in"
    assert process.wait(10) == 0


_FORGE = """
import sys, time
sys.path.insert(0, {package!r})
from stockade.session import protocol
from stockade.session.protocol import Message
frames = b"".join(protocol.encode(m) for m in (
    Message("data", 1, 1, b"all tests passed\\n"), Message("eof", 1, 1), Message("eof", 1, 2),
    Message("result", 1, body={{"exit_code": 0, "signal": None, "timed_out": False,
                                "cancelled": False, "start": 0, "wall": 0.1, "user": 0,
                                "system": 0}})))
with open({to_host!r}, "ab") as f:
    f.write(frames)
time.sleep(1)
print("REAL: tests failed")
sys.exit(7)
"""


@pytest.mark.not_windows  # (POSIX processes stand for the command user's Jobs)
def test_a_command_that_reaches_the_spool_cannot_forge_its_result(rendezvous):
    """Attack round on issue 36, W4: a command that can write the rendezvous folder appended
    protocol frames to to-host (exit 0, output of its choosing) and the host reported them
    while the command ran on. Now the spool's records are authenticated: the session ends,
    typed (`auth_failed`), and nothing forged is reported."""
    from stockade.session.errors import ProtocolError

    process = _guest(rendezvous, transport=rz.SPOOL)
    script = _FORGE.format(package=boot.PACKAGE_DIR, to_host=str(rendezvous / wsb_spool.TO_HOST))
    with pytest.raises(ProtocolError) as info, _LoopbackSandbox(
            rendezvous=rendezvous, process=process, networking=False) as sb:
        sb.run([sys.executable, "-c", script], timeout=30)
    assert info.value.code == "auth_failed"
    _GuestHandle(process).kill()


@pytest.mark.not_windows
def test_the_guest_accepts_only_the_host_address(rendezvous):
    process = _guest(rendezvous)
    try:
        record = _wait_ready(rendezvous)
        intruder = socket.socket()
        intruder.bind(("127.0.0.2", 0))  # loopback too, but not the host's address
        intruder.connect((record.address, record.port))
        intruder.settimeout(5)
        assert intruder.recv(1) == b""  # closed without a word
        intruder.close()
        channel, hello, _ = wsb.attach(str(rendezvous), SECRET, BOOT_ID, 30, lambda: True,
                                       networking=True)
        assert hello["agent"].startswith("stockade")
        channel.close()
    finally:
        _GuestHandle(process).kill()


@pytest.mark.not_windows
def test_a_wrong_secret_never_reaches_the_agent(rendezvous):
    process = _guest(rendezvous)
    try:
        with pytest.raises(rz.RendezvousError) as info:
            wsb.attach(str(rendezvous), bytes(32), BOOT_ID, 30, lambda: True, networking=True)
        assert info.value.code == "rendezvous_proof_invalid"
    finally:
        _GuestHandle(process).kill()


@pytest.mark.not_windows
def test_a_channel_other_than_the_plans_is_refused(rendezvous):
    process = _guest(rendezvous, transport=rz.SPOOL)
    try:
        with pytest.raises(rz.RendezvousError) as info:
            wsb.attach(str(rendezvous), SECRET, BOOT_ID, 30, lambda: True, networking=True)
        assert info.value.code == "rendezvous_invalid"
    finally:
        _GuestHandle(process).kill()


@pytest.mark.not_windows
@pytest.mark.parametrize("secret, password, code", [
    (None, b"pw\n", "secret_unavailable"),
    (SECRET, b"", "command_user_unavailable"),
])
def test_a_guest_that_cannot_start_refuses_typed(rendezvous, secret, password, code):
    process = _guest(rendezvous, secret=secret, password=password)
    with pytest.raises(SetupError) as info:
        wsb.attach(str(rendezvous), SECRET, BOOT_ID, 30, lambda: True, networking=True)
    assert info.value.code == code
    assert process.wait(10) == 3


def test_no_rendezvous_is_a_boot_failure(rendezvous):
    with pytest.raises(SessionError) as info:
        wsb.attach(str(rendezvous), SECRET, BOOT_ID, 5, lambda: False, networking=False)
    assert info.value.code == "session_boot_failed"
    began = time.monotonic()
    with pytest.raises(SessionError):
        wsb.attach(str(rendezvous), SECRET, BOOT_ID, 0.3, lambda: True, networking=False)
    assert time.monotonic() - began < 5


def _wait_ready(rendezvous) -> rz.Ready:
    deadline = time.monotonic() + 30
    while not (rendezvous / rz.RENDEZVOUS_FILE).exists():
        assert time.monotonic() < deadline, "the guest published no rendezvous"
        time.sleep(0.05)
    record = rz.parse((rendezvous / rz.RENDEZVOUS_FILE).read_bytes())
    assert isinstance(record, rz.Ready)
    return record


def test_keep_detached_is_refused_not_ignored(monkeypatch):
    """A Windows guest has no agent that keeps detached processes: asked for it, the
    sandbox is refused, typed, before anything boots."""
    monkeypatch.setattr(wsb, "_refuse_elsewhere", lambda: None)
    monkeypatch.setattr(wsb, "daemon", lambda: pytest.fail("booted"))
    with pytest.raises(UnenforceableError) as refused:
        wsb.WindowsSandbox(preset="read-only", keep_detached=True)
    assert refused.value.code == "unenforceable:keep_detached"


# --- the proxy, for the guest only ---------------------------------------------------------------

def test_the_proxys_listener_hands_on_only_the_guests_connections():
    listener = wsb.GuestOnly("127.0.0.1")
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    try:
        intruder = socket.socket()
        intruder.bind(("127.0.0.2", 0))
        intruder.connect(("127.0.0.1", port))
        guest = socket.create_connection(("127.0.0.1", port))
        listener.settimeout(10)
        conn, peer = listener.accept()
        assert peer[0] == "127.0.0.1" and peer[1] == guest.getsockname()[1]
        intruder.settimeout(5)
        assert intruder.recv(1) == b""  # closed unanswered
        for sock in (conn, guest, intruder):
            sock.close()
    finally:
        listener.close()


def test_the_proxy_is_never_served_on_a_loopback_address():
    record = rz.Ready(BOOT_ID, rz.TCP, "0" * 64, "127.0.0.1", 47470, "127.0.0.1")
    with pytest.raises(rz.RendezvousError) as info:
        wsb.serve_proxy(_request(network=NetworkSpec(mode="allowlist")), record, 3128)
    assert info.value.code == "rendezvous_invalid"


def test_commands_are_sent_to_the_proxy_the_guest_reaches():
    request = _request(env=(("A", "1"),))

    class Guest:
        proxy_address = ("172.20.1.1", 3128)

    class Handle:
        guest = Guest()

    session = boot.Session(request, Handle(), None, {})  # type: ignore[arg-type]
    env = wsb.command_env(request, session)
    assert env["A"] == "1" and env["HTTPS_PROXY"] == "http://172.20.1.1:3128"
    Guest.proxy_address = None
    assert wsb.command_env(request, session) == {"A": "1"}
