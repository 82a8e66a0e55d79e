"""In a VM guest: set the guest kernel's helpers (a core-dump pipe, the modprobe and hotplug
helpers, a uevent helper), trigger sysrq, remount or unmount what the guest's init mounted.
Any success is an escape: a helper runs with every capability in the guest, undoes its masks
and reads the host's files over the shares."""

import os

from _common import attempt, checked, libc, write

for path, value in (("/proc/sys/kernel/core_pattern", "|/bin/sh -c id"),
                    ("/proc/sys/kernel/modprobe", "/bin/sh"),
                    ("/proc/sys/kernel/hotplug", "/bin/sh"),
                    ("/sys/kernel/uevent_helper", "/bin/sh"),
                    ("/proc/sys/kernel/modules_disabled", "0"),
                    ("/proc/sysrq-trigger", "h")):
    if os.path.exists(path):
        attempt(f"write {path}", lambda p=path, v=value: write(p, v.encode()))
for mount_point in (b"/proc", b"/"):
    attempt(f"umount {mount_point.decode()}", lambda m=mount_point: checked(libc.umount2(m, 2)))
