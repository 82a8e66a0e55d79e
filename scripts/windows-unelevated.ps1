# Run one command as a fresh standard (non-administrator) local user, for the Windows workflow's
# unelevated job: its output is shown and its exit status is this script's. The user is made
# with a random password and removed afterwards.
#   pwsh scripts/windows-unelevated.ps1 "python scripts/windows_ci.py tests"
param([Parameter(Mandatory = $true)][string]$Command)
$ErrorActionPreference = "Stop"
$name = "stockade-ci"
$password = [guid]::NewGuid().ToString("N") + "aA1!"
net user $name $password /add /y | Out-Null  # a member of Users only
# The new user's environment is its own: the workflow's interpreter is named by its path.
$python = (Get-Command python).Source
$Command = $Command -replace '^python ', "`"$python`" "
try {
    # The checkout is the user's working directory: it writes its attestation there.
    icacls (Get-Location).Path /grant "${name}:(OI)(CI)M" /Q | Out-Null
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
    net user $name /delete | Out-Null
}
