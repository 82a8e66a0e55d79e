"""The ctypes definitions of stockade/windows against the real Windows SDK headers (mingw-w64's):
a C file of static assertions (windows_abi.py) on every structure's size, field offsets and
field sizes, laid out as a Windows x64 compiler does, on every constant's value and on every
bound function being declared, compiled with x86_64-w64-mingw32-gcc; and every bound function
exported by the DLL it is bound from, per mingw-w64's import libraries. Each check is shown to
fail when a defect is put back (a wrong value, swapped fields, a C long where the header has a
64-bit field, an undeclared function)."""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import shutil
import subprocess

import pytest
import windows_abi
from conftest import unavailable

from stockade.windows import api, probe_child, structs
from stockade.windows import constants as c

GCC = "x86_64-w64-mingw32-gcc"
NM = "x86_64-w64-mingw32-nm"
# DLLs that mingw-w64 ships no import library for: their functions are checked against the
# headers' declarations only.
NO_IMPORT_LIBRARY = {"kernelbase"}


@pytest.fixture(scope="module")
def gcc() -> str:
    path = shutil.which(GCC)
    if not path:
        unavailable(f"{GCC} is missing (Debian: apt-get install mingw-w64; scripts/test.sh "
                    "installs it)")
    return path


def compile_c(gcc: str, source: str, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "abi.c"
    path.write_text(source)
    return subprocess.run([gcc, "-std=c11", "-Wall", "-Werror", "-Wno-unused-variable",
                           *flags, str(path), "-o", str(tmp_path / "abi.out")],
                          capture_output=True, text=True, timeout=120)


def test_the_abi_matches_the_sdk_headers(gcc, tmp_path):
    source = windows_abi.c_source()
    layouts = windows_abi.Layouts().all()
    assert {layout.name for layout in layouts} == {
        name for name, value in vars(structs).items()
        if isinstance(value, type) and issubclass(value, ctypes.Structure)}
    assert len(re.findall(r"_Static_assert\(sizeof\(\w+\) ==", source)) == len(layouts)
    assert all(f'"{name}"' in source for name in windows_abi.constants()
               if name not in windows_abi.BIT_FIELDS)
    done = compile_c(gcc, source, tmp_path, "-c")
    assert done.returncode == 0, done.stderr


def test_bit_field_constants_are_the_headers_bits(gcc, tmp_path):
    done = compile_c(gcc, windows_abi.c_source(), tmp_path, "-S")
    assert done.returncode == 0, done.stderr
    seen = windows_abi.bit_field_values((tmp_path / "abi.out").read_text())
    assert seen == {name: getattr(c, name) for name in windows_abi.BIT_FIELDS}


def test_a_wrong_constant_fails_the_check(gcc, tmp_path):
    values = windows_abi.constants() | {"PROC_THREAD_ATTRIBUTE_JOB_LIST": 0x2000C}
    done = compile_c(gcc, windows_abi.c_source(values=values), tmp_path, "-c")
    assert done.returncode != 0 and '"PROC_THREAD_ATTRIBUTE_JOB_LIST"' in done.stderr
    # A HRESULT, compared as the header's signed LONG.
    values = windows_abi.constants() | {"HRESULT_NOT_FOUND": 0x80070491}
    done = compile_c(gcc, windows_abi.c_source(values=values), tmp_path, "-c")
    assert done.returncode != 0 and '"HRESULT_NOT_FOUND"' in done.stderr


def test_fields_in_the_wrong_order_fail_the_check(gcc, tmp_path):
    source = inspect.getsource(structs).replace(
        '("hProcess", HANDLE), ("hThread", HANDLE), ("dwProcessId", DWORD),\n'
        '                ("dwThreadId", DWORD)',
        '("hProcess", HANDLE), ("dwProcessId", DWORD), ("hThread", HANDLE),\n'
        '                ("dwThreadId", DWORD)')
    assert source != inspect.getsource(structs)
    layouts = windows_abi.Layouts(source).all()
    done = compile_c(gcc, windows_abi.c_source(layouts=layouts), tmp_path, "-c")
    assert done.returncode != 0
    assert "offsetof(PROCESS_INFORMATION, hThread)" in done.stderr


def test_a_c_long_is_laid_out_as_windows_does_not_as_this_platform(gcc, tmp_path):
    # LARGE_INTEGER written as ctypes.c_long: 8 bytes here (LP64), 4 on Windows (LLP64).
    source = inspect.getsource(structs).replace(
        '_fields_ = [("PerProcessUserTimeLimit", LARGE_INTEGER),',
        '_fields_ = [("PerProcessUserTimeLimit", ctypes.c_long),')
    assert ctypes.sizeof(ctypes.c_long) == 8  # as ctypes would have it on this host
    layouts = windows_abi.Layouts(source)
    basic = layouts.layout("JOBOBJECT_BASIC_LIMIT_INFORMATION")
    assert basic.fields[0].size == 4 and basic.fields[1].offset == 8
    done = compile_c(gcc, windows_abi.c_source(layouts=layouts.all()), tmp_path, "-c")
    assert done.returncode != 0
    assert "JOBOBJECT_BASIC_LIMIT_INFORMATION.PerProcessUserTimeLimit" in done.stderr
    windows_abi.check_local_sizes()
    assert windows_abi.WINDOWS_SIZES["c_wchar"] == 2 and windows_abi.WINDOWS_SIZES["c_ulong"] == 4


def test_an_undeclared_function_fails_the_check(gcc, tmp_path):
    functions = [*api._SIGNATURES, "CreateDesktopExA2"]
    done = compile_c(gcc, windows_abi.c_source(functions=functions), tmp_path, "-c")
    assert done.returncode != 0 and "CreateDesktopExA2" in done.stderr


def test_every_bound_function_is_exported_by_the_dll_it_is_bound_from(gcc):
    nm = shutil.which(NM)
    if not nm:
        unavailable(f"{NM} is missing (Debian: mingw-w64)")
    libraries = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(gcc))),
                             "x86_64-w64-mingw32", "lib")
    if not os.path.isdir(libraries):
        libraries = "/usr/x86_64-w64-mingw32/lib"
    exported: dict[str, set[str]] = {}
    for dll in set(api.DLLS) - NO_IMPORT_LIBRARY:
        listing = subprocess.run([nm, os.path.join(libraries, f"lib{dll}.a")],
                                 capture_output=True, text=True, check=True).stdout
        exported[dll] = {line.split()[-1][len("__imp_"):] for line in listing.splitlines()
                         if line.split() and line.split()[-1].startswith("__imp_")}
    wrong = {name: dll for name, (dll, *_) in api._SIGNATURES.items()
             if dll not in NO_IMPORT_LIBRARY and name not in exported[dll]}
    assert wrong == {}
    assert {dll for dll, *_ in api._SIGNATURES.values()} == set(api.DLLS)
    assert {name for name, (dll, *_) in api._SIGNATURES.items()
            if dll in NO_IMPORT_LIBRARY} == {"CompareObjectHandles"}


def test_the_probe_childs_own_values_are_the_backends():
    assert (probe_child.TOKEN_QUERY, probe_child.DESKTOP_READOBJECTS, probe_child.UOI_NAME) == (
        c.TOKEN_QUERY, c.DESKTOP_READOBJECTS, c.UOI_NAME)
    assert probe_child.TOKEN_CLASSES == {"is_appcontainer": c.TOKEN_IS_APP_CONTAINER,
                                         "capabilities": c.TOKEN_CAPABILITIES,
                                         "package": c.TOKEN_APP_CONTAINER_SID}
    assert probe_child.JOB_CLASSES == {"extended": c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                                       "ui": c.JOB_OBJECT_BASIC_UI_RESTRICTIONS,
                                       "cpu_rate": c.JOB_OBJECT_CPU_RATE_CONTROL_INFORMATION}
    assert probe_child.MITIGATION_POLICIES == {
        "extension_points": c.PROCESS_EXTENSION_POINT_DISABLE_POLICY,
        "image_load": c.PROCESS_IMAGE_LOAD_POLICY}
