"""VM containment on Linux: a QEMU guest whose init starts the session agent (docs/vm.md).

`cpio` (the initramfs archive format), `initramfs` (the guest's first userspace: modules and an
init script), `machine` (the QEMU command line for a policy), `qemu` (booting, the handshake over
a virtio-serial port, and `VmSandbox`).
"""
