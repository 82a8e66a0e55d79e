"""The guest's bootstrap: a PowerShell script the LogonCommand runs, as the guest's administrator,
from the read-only boot folder, and `guest.py`, the Python entry it starts last
(docs/windows-sandbox.md).

In this order, each step refusing the boot (a `refused` rendezvous with a stable code, and no
agent) when it fails:

1. the network. With one (`allowlist`): the host's address, the next hop of the guest's only
   IPv4 default route. Without (`none`, Networking disabled): check that the guest has no IPv4
   address but loopback;
2. lock the firewall: every profile on, inbound and outbound blocked by default, every existing
   rule removed, then allow exactly (with a network only): inbound TCP to the agent's port from
   the host's address, outbound TCP to the host's proxy port, and the DHCP client service's
   requests (so the guest keeps its address);
3. verify the lock: read every profile and every enabled allow rule of the active store back
   (exactly the rules above, with exactly their ports and address), and, with a network,
   check that a DNS query to the host and a TCP connection to the host's port 53 both fail;
4. verify the mappings: every read-only folder refuses a write, every mask shows this boot's
   marker;
5. create the command user: a standard local account (the Users group only) with a random
   password, and verify it is in none of the privileged groups;
6. start the guest entry (wsb_guest), the password on its stdin: it takes the secret and
   serves the agent, which runs each command as that user.

Every value in the script is a PowerShell single-quoted literal (quotes of every kind doubled)
or a decimal integer; paths were admitted by the plan before they get here.
"""

from __future__ import annotations

from stockade.errors import UnenforceableError
from stockade.vm import wsb_rendezvous as rz
from stockade.vm.wsb_guest import COMMAND_USER
from stockade.vm.wsb_plan import GUEST_BOOT, GUEST_RENDEZVOUS, MASK_MARKER, Plan

GUEST_ENTRY = "guest.py"
AGENT_PORT = 47470  # the agent's TCP port in the guest (the guest is fresh: nothing else has it)
DNS_PORT = 53
CHECK_TIMEOUT_MS = 2000
PASSWORD_BYTES = 24  # random bytes of the command user's password (base64 after a prefix that
PASSWORD_PREFIX = "Aa1!"  # meets any complexity rule)
# Administrators, Backup Operators, Power Users, Server Operators, Network Configuration
# Operators: the command user is in none of them
PRIVILEGED_GROUPS = ("S-1-5-32-544", "S-1-5-32-551", "S-1-5-32-547", "S-1-5-32-549",
                     "S-1-5-32-556")
USERS_GROUP = "S-1-5-32-545"
_PS_QUOTES = "'\u2018\u2019\u201a\u201b"  # PowerShell treats each as a single quote
# The guest entry loads Stockade from its own (mapped, read-only) directory, as the Linux
# session does, then runs the guest side of the rendezvous (wsb_guest.main).
GUEST_PY = """\
import os, sys, importlib.util as u
p = sys.argv[1]
s = u.spec_from_file_location('stockade', os.path.join(p, '__init__.py'),
                              submodule_search_locations=[p])
m = u.module_from_spec(s)
sys.modules['stockade'] = m
s.loader.exec_module(m)
from stockade.vm.wsb_guest import main
sys.exit(main(sys.argv[2:]))
"""


def ps(text: str) -> str:
    """`text` as a PowerShell single-quoted literal."""
    if any(ord(c) < 0x20 for c in text):
        raise UnenforceableError("filesystem.path", f"{text[:80]!r} holds a control character")
    for quote in _PS_QUOTES:
        text = text.replace(quote, quote * 2)
    return f"'{text}'"


def rules(plan: Plan, agent_port: int = AGENT_PORT) -> list[tuple[str, ...]]:
    """The firewall's allow rules: (name, direction, protocol, local port, remote port, remote
    address, service); none for a guest without a network."""
    if not plan.networking:
        return []
    allowed = [("stockade-agent", "Inbound", "TCP", str(agent_port), "Any", "$HostAddress", "")]
    if plan.proxy_port is not None:
        allowed.append(("stockade-proxy", "Outbound", "TCP", "Any", str(plan.proxy_port),
                        "$HostAddress", ""))
    allowed.append(("stockade-dhcp", "Outbound", "UDP", "68", "67", "Any", "Dhcp"))
    return allowed


def script(plan: Plan, python: str, package_dir: str, agent_port: int = AGENT_PORT) -> str:
    """The bootstrap for `plan`; `python` and `package_dir` are mapped at the same paths."""
    allowed = rules(plan, agent_port)
    lines = [
        f"# Stockade Windows Sandbox bootstrap for boot {plan.boot_id} (generated; see",
        "# stockade/vm/wsb_bootstrap.py). Nothing of a command runs before it succeeds.",
        "$ErrorActionPreference = 'Stop'",
        "Set-StrictMode -Version 3.0",
        f"$BootId = {ps(plan.boot_id)}",
        f"$Rendezvous = {ps(GUEST_RENDEZVOUS)}",
        "function Refuse([string]$Code, [string]$Message) {",
        f"  $text = $Message.Substring(0, [Math]::Min($Message.Length, {rz.MAX_MESSAGE}))",
        f"  $record = [ordered]@{{ version = {rz.VERSION}; status = 'refused'; boot = $BootId; "
        "code = $Code; message = $text }",
        f"  $temp = Join-Path $Rendezvous {ps(rz.RENDEZVOUS_TEMP)}",
        "  [IO.File]::WriteAllText($temp, ($record | ConvertTo-Json -Compress), "
        "[Text.UTF8Encoding]::new($false))",
        f"  Move-Item -LiteralPath $temp -Destination (Join-Path $Rendezvous "
        f"{ps(rz.RENDEZVOUS_FILE)}) -Force",
        "  exit 1",
        "}",
        "try {",
    ]
    if plan.networking:
        lines += [
            "  # 1. the host: the next hop of the only default route",
            "  $routes = @(Get-NetRoute -AddressFamily IPv4 -DestinationPrefix '0.0.0.0/0')",
            "  if ($routes.Count -ne 1) { Refuse 'guest_network' "
            "\"expected one default route, found $($routes.Count)\" }",
            "  $HostAddress = $routes[0].NextHop",
        ]
    else:
        lines += [
            "  # 1. no network: Networking is disabled, and nothing but loopback has an address",
            "  $addresses = @(Get-NetIPAddress -AddressFamily IPv4 | Where-Object { "
            "$_.IPAddress -ne '127.0.0.1' })",
            "  if ($addresses.Count -ne 0) { Refuse 'guest_network' "
            "\"the guest has a network: $($addresses[0].IPAddress)\" }",
        ]
    lines += [
        "  # 2. the firewall lock",
        "  Set-NetFirewallProfile -All -Enabled True -DefaultInboundAction Block "
        "-DefaultOutboundAction Block -AllowInboundRules True -NotifyOnListen False",
        "  Get-NetFirewallRule | Remove-NetFirewallRule",
    ]
    for name, direction, protocol, local, remote, address, service in allowed:
        extra = f" -Service {ps(service)}" if service else ""
        lines.append(f"  New-NetFirewallRule -Name {ps(name)} -DisplayName {ps(name)} "
                     f"-Direction {direction} -Action Allow -Protocol {protocol} "
                     f"-LocalPort {local} -RemotePort {remote} -RemoteAddress {address} "
                     f"-Profile Any{extra} | Out-Null")
    lines += [
        "  # 3. verify the lock before anything else runs",
        "  foreach ($p in @(Get-NetFirewallProfile -PolicyStore ActiveStore)) {",
        "    if ($p.Enabled -ne 'True' -or $p.DefaultInboundAction -ne 'Block' -or "
        "$p.DefaultOutboundAction -ne 'Block') {",
        "      Refuse 'firewall_unverified' \"profile $($p.Name) is not locked\" }",
        "  }",
        "  $allowed = @(Get-NetFirewallRule -PolicyStore ActiveStore | Where-Object { "
        "$_.Enabled -eq 'True' -and $_.Action -eq 'Allow' })",
        f"  $expected = @({', '.join(ps(r[0]) for r in allowed)})",
        "  $names = @($allowed | ForEach-Object { $_.Name } | Sort-Object)",
        "  if (($names -join ',') -ne (($expected | Sort-Object) -join ',')) {",
        "    Refuse 'firewall_unverified' \"unexpected allow rules: $($names -join ', ')\" }",
        "  function Check-Rule([string]$Name, [string]$Direction, [string]$Protocol, "
        "[string]$Local, [string]$Remote, [string]$Address) {",
        "    $rule = $allowed | Where-Object { $_.Name -eq $Name }",
        "    $ports = $rule | Get-NetFirewallPortFilter",
        "    $addresses = $rule | Get-NetFirewallAddressFilter",
        "    if ([string]$rule.Direction -ne $Direction -or [string]$ports.Protocol -ne $Protocol "
        "-or [string]$ports.LocalPort -ne $Local -or [string]$ports.RemotePort -ne $Remote -or "
        "[string]$addresses.RemoteAddress -ne $Address) {",
        "      Refuse 'firewall_unverified' \"rule $Name is not as written\" }",
        "  }",
    ]
    for name, direction, protocol, local, remote, address, _ in allowed:
        lines.append(f"  Check-Rule {ps(name)} {ps(direction)} {ps(protocol)} {ps(local)} "
                     f"{ps(remote)} {address if address.startswith('$') else ps(address)}")
    if plan.networking:
        lines += [
            "  $escaped = $true",
            "  try { Resolve-DnsName -Name 'www.microsoft.com' -Server $HostAddress -DnsOnly "
            "-QuickTimeout -ErrorAction Stop | Out-Null } catch { $escaped = $false }",
            "  if ($escaped) { Refuse 'firewall_unverified' 'a DNS query to the host was "
            "answered' }",
            "  $client = [Net.Sockets.TcpClient]::new()",
            f"  try {{ $escaped = $client.ConnectAsync($HostAddress, {DNS_PORT})"
            f".Wait({CHECK_TIMEOUT_MS}) }} catch {{ $escaped = $false }} "
            "finally { $client.Dispose() }",
            f"  if ($escaped) {{ Refuse 'firewall_unverified' 'a TCP connection to port "
            f"{DNS_PORT} of the host was accepted' }}",
        ]
    lines.append("  # 4. verify the mappings")
    for path in plan.read_only:
        lines += [
            f"  $path = {ps(path)}",
            "  if (-not (Test-Path -LiteralPath $path -PathType Container)) {",
            "    Refuse 'filesystem_unverified' \"$path is not mapped\" }",
            "  $probe = Join-Path $path \".stockade-probe-$BootId\"",
            "  $wrote = $true",
            "  try { [IO.File]::WriteAllBytes($probe, [byte[]]@()) } catch { $wrote = $false }",
            "  if ($wrote) { Remove-Item -LiteralPath $probe -Force",
            "    Refuse 'filesystem_unverified' \"$path is writable in the guest\" }",
        ]
    for mask in plan.masks:
        lines += [
            f"  $entries = @(Get-ChildItem -LiteralPath {ps(mask.guest)} -Force)",
            f"  if ($entries.Count -ne 1 -or $entries[0].Name -ne "
            f"'{MASK_MARKER}-{plan.boot_id}') {{",
            f"    Refuse 'filesystem_unverified' {ps(mask.guest + ' is not masked')} }}",
        ]
    lines += [
        "  # 5. the command user: a standard account, in none of the privileged groups",
        f"  $bytes = [byte[]]::new({PASSWORD_BYTES})",
        "  [Security.Cryptography.RandomNumberGenerator]::Create().GetBytes($bytes)",
        f"  $Password = {ps(PASSWORD_PREFIX)} + [Convert]::ToBase64String($bytes)",
        f"  $user = New-LocalUser -Name {ps(COMMAND_USER)} -Password (ConvertTo-SecureString "
        "$Password -AsPlainText -Force) -AccountNeverExpires -PasswordNeverExpires "
        "-UserMayNotChangePassword",
        f"  Add-LocalGroupMember -SID {ps(USERS_GROUP)} -Member $user",
        f"  $privileged = @({', '.join(ps(g) for g in PRIVILEGED_GROUPS)})",
        "  # (those of them this edition has: Server Operators exists on domain controllers only)",
        "  foreach ($group in @(Get-LocalGroup | Where-Object { $privileged -contains "
        "$_.SID.Value })) {",
        "    if (@(Get-LocalGroupMember -Group $group | Where-Object { $_.SID -eq $user.SID })"
        ".Count -ne 0) {",
        "      Refuse 'command_user_unverified' \"the command user is in group $($group.Name)\" }",
        "  }",
        "  # 6. the guest entry: takes the secret, writes the rendezvous, serves the agent",
    ]
    entry = (f"& {ps(python)} -I -S -B {ps(GUEST_BOOT + chr(92) + GUEST_ENTRY)} "
             f"{ps(package_dir)} $Rendezvous $BootId {ps(str(plan.pids or '-'))}")
    transport = f" 'tcp' $HostAddress {agent_port}" if plan.networking else " 'spool'"
    lines += [
        f"  $Password | {entry}{transport}",
        "  exit $LASTEXITCODE",
        "} catch {",
        "  Refuse 'bootstrap_failed' $_.Exception.Message",
        "}",
    ]
    return "\r\n".join(lines) + "\r\n"


def encode_script(text: str) -> bytes:
    """The script's bytes: UTF-8 with a byte-order mark, which Windows PowerShell 5.1 needs to
    read anything but ASCII correctly."""
    return b"\xef\xbb\xbf" + text.encode("utf-8")
