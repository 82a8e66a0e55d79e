"""Build step (Linux only): stockade/linux/reaper, a small static program, not a Python
extension. It is what keeps an idle sandbox alive (stockade/linux/reaper.py). Building it is
optional: without a C compiler and a static C library, Stockade still works, pid 1 then stays a
Python process, and `stockade report` says so (`idle_pid1`)."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REAPER = "stockade.linux.reaper"


class BuildPrograms(build_ext):
    """Links the reaper as a static executable, under its plain name."""

    def get_ext_filename(self, fullname: str) -> str:
        # (setuptools asks both by the full dotted name and by the last part alone)
        if fullname in (REAPER, REAPER.rpartition(".")[2]):
            return os.path.join(*fullname.split("."))  # a program: no extension suffix
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != REAPER:
            super().build_extension(ext)
            return
        objects = self.compiler.compile(ext.sources, output_dir=self.build_temp,
                                        extra_postargs=["-O2", "-Wall"])
        target = self.get_ext_fullpath(ext.name)
        self.compiler.link_executable(objects, os.path.basename(target),
                                      output_dir=os.path.dirname(target),
                                      extra_postargs=["-static", "-s"])


programs = [Extension(REAPER, ["stockade/linux/reaper.c"], optional=True)]
setup(ext_modules=programs if sys.platform.startswith("linux") else [],
      cmdclass={"build_ext": BuildPrograms})
