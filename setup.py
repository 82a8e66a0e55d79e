"""Build step (Linux only), two pieces of C that are not Python extensions:

- stockade/linux/supervisor, a small static program: the sandbox's pid 1 once the view is
  built (stockade/linux/supervisor.py). It needs a C compiler and a static C library; where
  the build fails, the install still succeeds, and the Linux backend refuses to run
  (`supervisor_not_built`) while the rest of Stockade works. A wheel carries both built
  (scripts/build_wheel.sh), so installing it needs no compiler.
- stockade/linux/librelay.so, a plain shared library: the egress proxy's tunnel relay, called
  through ctypes (stockade/net/relay.py). Where it is not built, the proxy relays in Python."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

SUPERVISOR = "stockade.linux.supervisor"
RELAY = "stockade.linux.librelay"


class BuildPrograms(build_ext):
    """Links the supervisor as a static executable and the relay as a shared library, each
    under its plain name."""

    def get_ext_filename(self, fullname: str) -> str:
        # (setuptools asks both by the full dotted name and by the last part alone)
        for name, suffix in ((SUPERVISOR, ""), (RELAY, ".so")):  # a program has none
            if fullname in (name, name.rpartition(".")[2]):
                return os.path.join(*fullname.split(".")) + suffix
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name not in (SUPERVISOR, RELAY):
            super().build_extension(ext)
            return
        objects = self.compiler.compile(ext.sources, output_dir=self.build_temp,
                                        extra_postargs=["-O2", "-Wall"]
                                        + (["-fPIC"] if ext.name == RELAY else []))
        target = self.get_ext_fullpath(ext.name)
        if ext.name == RELAY:
            self.compiler.link_shared_object(objects, target, extra_postargs=["-s"])
            return
        self.compiler.link_executable(objects, os.path.basename(target),
                                      output_dir=os.path.dirname(target),
                                      extra_postargs=["-static", "-s"])


class PlatformWheel(bdist_wheel):
    """The wheel is tied to the platform (it carries two native programs) but to no Python
    ABI: neither program is an extension module, so one wheel serves every Python 3."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


programs = [Extension(SUPERVISOR, [f"stockade/linux/{part}.c" for part in
                                   ("supervisor", "template", "refresh", "confine", "memwatch",
                                    "namewatch")],
                      depends=["stockade/linux/supervisor.h"], optional=True),
            Extension(RELAY, ["stockade/linux/relay.c"], optional=True)]
setup(ext_modules=programs if sys.platform.startswith("linux") else [],
      cmdclass={"build_ext": BuildPrograms, "bdist_wheel": PlatformWheel})
