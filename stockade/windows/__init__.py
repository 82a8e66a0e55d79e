"""The Windows native backend: a fresh AppContainer per launch, a kill-on-close Job attached at
creation, access-control entries for that AppContainer on exactly the compiled roots (recorded in
the launch ledger before they are applied, and reverted at settlement), a private desktop and a
closed environment. See docs/windows.md for what it enforces and what has been verified where.

Importing this package, or any module in it, does nothing on other platforms: the Win32 functions
are bound on first use (`api.win32()`), and only on Windows. Most modules are pure logic over
plain data — command lines, environment blocks, SIDs, ACLs, the ACE plan, path admission, Job
limits, the desktop's security descriptor — and are tested on every platform.
"""
