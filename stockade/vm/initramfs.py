"""The guest's first userspace: a static busybox, the kernel modules the guest needs (9p over
virtio, virtio-pci, virtio-console, virtio-net, with their dependencies, from that kernel's own
/lib/modules) and an init script, packed as a newc initramfs."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from stockade.errors import UnavailableError
from stockade.vm.cpio import Archive

BUSYBOX = "/bin/busybox"
# What the guest needs from the kernel: each option must be built in (y) or a module (m).
NEEDED = {"CONFIG_VIRTIO_PCI": "virtio_pci", "CONFIG_VIRTIO_CONSOLE": "virtio_console",
          "CONFIG_NET_9P_VIRTIO": "9pnet_virtio", "CONFIG_9P_FS": "9p",
          "CONFIG_VIRTIO_NET": "virtio_net"}


@dataclass(frozen=True)
class Kernel:
    """A bootable kernel: its image and the modules (in load order) the guest must insert."""

    release: str
    image: str
    modules: tuple[str, ...]


def find_kernel(boot: str = "/boot", modules: str = "/lib/modules") -> Kernel:
    """The newest kernel in `boot` that can run the guest; UnavailableError names what lacks."""
    reasons = []
    for image in sorted(glob.glob(f"{boot}/vmlinuz-*"), reverse=True):
        release = image.removeprefix(f"{boot}/vmlinuz-")
        try:
            with open(f"{boot}/config-{release}") as f:
                config = dict(re.findall(r"^(CONFIG_\w+)=(\S+)$", f.read(), re.M))
        except OSError as exc:
            reasons.append(f"{release}: no config ({exc.strerror})")
            continue
        missing = [name for name in NEEDED if config.get(name) not in ("y", "m")]
        if missing:
            reasons.append(f"{release}: lacks {', '.join(missing)}")
            continue
        if not os.access(image, os.R_OK):
            reasons.append(f"{release}: {image} is not readable")
            continue
        wanted = [module for name, module in NEEDED.items() if config[name] == "m"]
        return Kernel(release, image, load_order(f"{modules}/{release}", wanted))
    raise UnavailableError("vm_kernel_unavailable", "no kernel with virtio-pci, virtio-console, "
                           f"virtio-net and 9p in {boot} "
                           f"({'; '.join(reasons) or 'none installed'})")


def load_order(tree: str, wanted: list[str]) -> tuple[str, ...]:
    """Paths of `wanted` modules and their dependencies, each after what it depends on."""
    try:
        with open(f"{tree}/modules.dep") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UnavailableError("vm_kernel_unavailable",
                               f"cannot read {tree}/modules.dep: {exc.strerror}") from None
    deps = {}
    for line in lines:
        module, _, rest = line.partition(":")
        deps[_name(module)] = (module, rest.split())
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in deps:
            raise UnavailableError("vm_kernel_unavailable", f"module {name} is not in {tree}")
        module, needs = deps[name]
        for need in needs:
            visit(_name(need))
        path = f"{tree}/{module}"
        if not path.endswith(".ko"):
            raise UnavailableError("vm_kernel_unavailable", f"{path}: compressed modules are "
                                   "not supported")
        if path not in order:
            order.append(path)

    for name in wanted:
        visit(name)
    return tuple(order)


def build(kernel: Kernel, init: str) -> bytes:
    """The initramfs: /init (the script `init`), busybox, and the modules as /m/NNN.ko."""
    if not os.access(BUSYBOX, os.X_OK):
        raise UnavailableError("vm_busybox_unavailable",
                               f"{BUSYBOX} is missing (install busybox-static)")
    archive = Archive()
    for directory in ("bin", "dev", "proc", "sys", "m", "newroot"):
        archive.directory(directory)
    with open(BUSYBOX, "rb") as f:
        archive.file("bin/busybox", f.read(), 0o755)
    archive.symlink("bin/sh", "busybox")
    for index, path in enumerate(kernel.modules):
        with open(path, "rb") as f:
            archive.file(f"m/{index:03}.ko", f.read())  # the glob in /init sorts
    archive.file("init", init.encode(), 0o755)
    return archive.finish()


def _name(module: str) -> str:
    return os.path.basename(module).split(".ko")[0].replace("-", "_")
