# Run one command as a fresh standard (non-administrator) local user, for the Windows workflow's
# unelevated job: its output is shown and its exit status is this script's. The user is made
# with a random password and removed afterwards.
#   pwsh scripts/windows-unelevated.ps1 "python scripts/windows_ci.py tests"
param([Parameter(Mandatory = $true)][string]$Command)
$ErrorActionPreference = "Stop"
$name = "stockade-ci"
$password = [guid]::NewGuid().ToString("N") + "aA1!"
# The new user's environment is its own: the workflow's interpreter is named by its path.
$python = (Get-Command python).Source
$Command = $Command -replace '^python ', "`"$python`" "

# Start-Process -Credential (CreateProcessWithLogonW) starts the user on the window station and
# desktop its STARTUPINFO names or, lpDesktop NULL, on this process's. Microsoft's page for
# CreateProcessWithLogonW: the application must add permission for the user to either (only
# Windows XP added it to the inherited ones itself). Their DACLs allow this logon session and
# SYSTEM only, so without entries the user's processes could not load user32, nor Stockade add
# its AppContainer's entry to the station or create its private desktop there
# (window_station_denied). So the user is granted this process's station and desktop (what a
# NULL lpDesktop inherits) for the run: on the station every window-station right with
# READ_CONTROL and WRITE_DAC (Stockade adds and removes its launches' entries), on the desktop
# every desktop right; both entries are removed afterwards. Not verified on a real host: that
# Start-Process -Credential passes lpDesktop NULL (if it named WinSta0\Default from a service's
# station, the grant would be on the wrong station).
Add-Type -TypeDefinition @"
using System;
using System.ComponentModel;
using System.Runtime.InteropServices;
using System.Security.AccessControl;
using System.Security.Principal;

public static class StockadeUserObjects {
    const uint DACL_SECURITY_INFORMATION = 4, READ_CONTROL = 0x20000, WRITE_DAC = 0x40000;
    const int UOI_NAME = 2;
    public const int STATION_RIGHTS = 0x37F | 0x20000 | 0x40000;  // WINSTA_ALL_ACCESS, READ_CONTROL, WRITE_DAC
    public const int DESKTOP_RIGHTS = 0x1FF | 0x20000;  // every desktop right, READ_CONTROL

    [DllImport("user32.dll", SetLastError = true)] static extern IntPtr GetProcessWindowStation();
    [DllImport("user32.dll", SetLastError = true)] static extern IntPtr GetThreadDesktop(uint thread);
    [DllImport("kernel32.dll")] static extern uint GetCurrentThreadId();
    [DllImport("user32.dll", SetLastError = true)]
    static extern bool GetUserObjectInformationW(IntPtr obj, int index, byte[] info, uint length, out uint needed);
    [DllImport("user32.dll", SetLastError = true, CharSet = CharSet.Unicode)]
    static extern IntPtr OpenWindowStationW(string name, bool inherit, uint access);
    [DllImport("user32.dll", SetLastError = true)] static extern bool CloseWindowStation(IntPtr station);
    [DllImport("user32.dll", SetLastError = true, CharSet = CharSet.Unicode)]
    static extern IntPtr OpenDesktopW(string name, uint flags, bool inherit, uint access);
    [DllImport("user32.dll", SetLastError = true)] static extern bool CloseDesktop(IntPtr desktop);
    [DllImport("user32.dll", SetLastError = true)]
    static extern bool GetUserObjectSecurity(IntPtr obj, ref uint requested, byte[] sd, uint length, out uint needed);
    [DllImport("user32.dll", SetLastError = true)]
    static extern bool SetUserObjectSecurity(IntPtr obj, ref uint requested, byte[] sd);

    static string Name(IntPtr obj) {
        var buffer = new byte[512];
        uint needed;
        if (!GetUserObjectInformationW(obj, UOI_NAME, buffer, (uint)buffer.Length, out needed))
            throw new Win32Exception();
        return System.Text.Encoding.Unicode.GetString(buffer, 0, (int)needed).TrimEnd('\0');
    }

    // The DACL of `obj` with every entry for `sid` removed, then, if `rights`, one allowing them.
    static void Change(IntPtr obj, SecurityIdentifier sid, int rights) {
        uint requested = DACL_SECURITY_INFORMATION, needed;
        GetUserObjectSecurity(obj, ref requested, null, 0, out needed);
        var data = new byte[needed];
        if (!GetUserObjectSecurity(obj, ref requested, data, needed, out needed))
            throw new Win32Exception();
        var descriptor = new RawSecurityDescriptor(data, 0);
        var dacl = descriptor.DiscretionaryAcl;
        if (dacl == null) return;  // (no DACL: everyone has every right already)
        for (int i = dacl.Count - 1; i >= 0; i--) {
            var known = dacl[i] as KnownAce;
            if (known != null && known.SecurityIdentifier == sid) dacl.RemoveAce(i);
        }
        if (rights != 0)
            dacl.InsertAce(dacl.Count, new CommonAce(AceFlags.None, AceQualifier.AccessAllowed,
                                                     rights, sid, false, null));
        descriptor.DiscretionaryAcl = dacl;
        var changed = new byte[descriptor.BinaryLength];
        descriptor.GetBinaryForm(changed, 0);
        requested = DACL_SECURITY_INFORMATION;
        if (!SetUserObjectSecurity(obj, ref requested, changed)) throw new Win32Exception();
    }

    // Grant (or, with `grant` false, revoke) `sid` this process's window station and desktop.
    public static void Set(SecurityIdentifier sid, bool grant) {
        IntPtr station = OpenWindowStationW(Name(GetProcessWindowStation()), false, READ_CONTROL | WRITE_DAC);
        if (station == IntPtr.Zero) throw new Win32Exception();
        try { Change(station, sid, grant ? STATION_RIGHTS : 0); }
        finally { CloseWindowStation(station); }
        IntPtr desktop = OpenDesktopW(Name(GetThreadDesktop(GetCurrentThreadId())), 0, false, READ_CONTROL | WRITE_DAC);
        if (desktop == IntPtr.Zero) throw new Win32Exception();
        try { Change(desktop, sid, grant ? DESKTOP_RIGHTS : 0); }
        finally { CloseDesktop(desktop); }
    }
}
"@

net user $name $password /add /y | Out-Null  # a member of Users only
$sid = $null
try {
    $sid = (New-Object System.Security.Principal.NTAccount($name)).Translate(
        [System.Security.Principal.SecurityIdentifier])
    # The checkout is the user's working directory: it writes its attestation there.
    icacls (Get-Location).Path /grant "${name}:(OI)(CI)M" /Q | Out-Null
    [StockadeUserObjects]::Set($sid, $true)
    $credential = New-Object System.Management.Automation.PSCredential(
        $name, (ConvertTo-SecureString $password -AsPlainText -Force))
    $out = New-TemporaryFile
    $err = New-TemporaryFile
    $process = Start-Process -FilePath "cmd.exe" -ArgumentList "/d", "/c", $Command `
        -Credential $credential -LoadUserProfile -WorkingDirectory (Get-Location).Path `
        -RedirectStandardOutput $out -RedirectStandardError $err -Wait -PassThru
    Get-Content $out
    Get-Content $err
    if ($null -eq $process.ExitCode) { exit 1 }  # never a pass without a status
    exit $process.ExitCode
} finally {
    try { if ($sid) { [StockadeUserObjects]::Set($sid, $false) } }
    finally { net user $name /delete | Out-Null }
}
