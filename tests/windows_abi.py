"""The Windows ABI of stockade/windows, as a C file of `_Static_assert`s for a Windows compiler
(mingw-w64) to check against the real SDK headers: every structure's size, and each field's
offset and size; every constant's value; every bound function declared by the headers.

Layouts are computed here as a Windows x64 (LLP64) compiler lays them out, from the types the
fields are *written* with in structs.py (read from its source), never from this platform's
ctypes: on 64-bit Linux `ctypes.c_long` is 8 bytes and `ctypes.c_uint64 is ctypes.c_ulong`, so
ctypes cannot tell a Windows LONG (4 bytes) from a 64-bit integer, nor is `c_wchar` 2 bytes.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
from dataclasses import dataclass

from stockade.windows import api, structs
from stockade.windows import constants as c

# Windows x64 sizes of the ctypes types a field may be written with (alignment = size).
WINDOWS_SIZES = {
    "c_int8": 1, "c_uint8": 1, "c_byte": 1, "c_ubyte": 1, "c_char": 1, "c_bool": 1,
    "c_int16": 2, "c_uint16": 2, "c_short": 2, "c_ushort": 2, "c_wchar": 2,
    "c_int32": 4, "c_uint32": 4, "c_int": 4, "c_uint": 4,
    "c_long": 4, "c_ulong": 4,  # LLP64: a C long is 32 bits on Windows
    "c_int64": 8, "c_uint64": 8, "c_longlong": 8, "c_ulonglong": 8,
    "c_size_t": 8, "c_ssize_t": 8, "c_void_p": 8, "c_char_p": 8, "c_wchar_p": 8,
    "c_float": 4, "c_double": 8,
}
POINTER = 8

# Constants whose header spelling differs from the Python name: the C expression to compare.
HEADER_EXPRESSIONS = {
    "MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON":
        "PROCESS_CREATION_MITIGATION_POLICY_EXTENSION_POINT_DISABLE_ALWAYS_ON",
    "MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON":
        "PROCESS_CREATION_MITIGATION_POLICY_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON",
    "MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON":
        "PROCESS_CREATION_MITIGATION_POLICY_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON",
    "JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION": "JobObjectBasicAccountingInformation",
    "JOB_OBJECT_BASIC_UI_RESTRICTIONS": "JobObjectBasicUIRestrictions",
    "JOB_OBJECT_EXTENDED_LIMIT_INFORMATION": "JobObjectExtendedLimitInformation",
    "JOB_OBJECT_CPU_RATE_CONTROL_INFORMATION": "JobObjectCpuRateControlInformation",
    "PROCESS_EXTENSION_POINT_DISABLE_POLICY": "ProcessExtensionPointDisablePolicy",
    "PROCESS_IMAGE_LOAD_POLICY": "ProcessImageLoadPolicy",
    "FILE_GENERIC_READ_EXECUTE": "FILE_GENERIC_READ | FILE_GENERIC_EXECUTE",
    "FILE_MODIFY": "FILE_GENERIC_READ | FILE_GENERIC_WRITE | FILE_GENERIC_EXECUTE | DELETE",
    "TOKEN_USER": "TokenUser", "TOKEN_SESSION_ID": "TokenSessionId",
    "TOKEN_ELEVATION": "TokenElevation",
    "TOKEN_IS_APP_CONTAINER": "TokenIsAppContainer", "TOKEN_CAPABILITIES": "TokenCapabilities",
    "TOKEN_APP_CONTAINER_SID": "TokenAppContainerSid",
    "HRESULT_ALREADY_EXISTS": "__HRESULT_FROM_WIN32(ERROR_ALREADY_EXISTS)",
    "HRESULT_FILE_NOT_FOUND": "__HRESULT_FROM_WIN32(ERROR_FILE_NOT_FOUND)",
    "HRESULT_PATH_NOT_FOUND": "__HRESULT_FROM_WIN32(ERROR_PATH_NOT_FOUND)",
    "HRESULT_NOT_FOUND": "__HRESULT_FROM_WIN32(ERROR_NOT_FOUND)",
    "PROCESS_BASIC_INFORMATION_CLASS": "ProcessBasicInformation",
    "FILE_DISPOSITION_INFO_CLASS": "FileDispositionInfo",
}
# Constants that are bit fields of a union's Flags in the headers: (structure, field). A
# constant expression cannot name a bit field's place, so these become initialised objects
# whose bytes the test reads from the compiler's assembly.
BIT_FIELDS = {
    "EXTENSION_POINTS_DISABLED": ("PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY",
                                  "DisableExtensionPoints"),
    "IMAGE_NO_REMOTE": ("PROCESS_MITIGATION_IMAGE_LOAD_POLICY", "NoRemoteImages"),
    "IMAGE_NO_LOW_LABEL": ("PROCESS_MITIGATION_IMAGE_LOAD_POLICY", "NoLowMandatoryLabelImages"),
}
HEADERS = ("windows.h", "winternl.h", "userenv.h", "sddl.h", "aclapi.h", "objbase.h")
PREAMBLE = "#define _WIN32_WINNT 0x0A00\n#define NTDDI_VERSION 0x0A000006\n#define WINVER 0x0A00\n"


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Layout:
    name: str
    size: int
    align: int
    fields: tuple[Field, ...]


class Layouts:
    """Windows x64 layouts of the structures in a module's source (structs.py by default)."""

    def __init__(self, source: str | None = None) -> None:
        tree = ast.parse(source if source is not None else inspect.getsource(structs))
        self.aliases: dict[str, ast.expr] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                self.aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        self.done: dict[str, Layout] = {}

    def all(self) -> list[Layout]:
        return [self.layout(name) for name in self.classes]

    def layout(self, name: str) -> Layout:
        if name not in self.done:
            self.done[name] = self._lay_out(self.classes[name])
        return self.done[name]

    def _lay_out(self, node: ast.ClassDef) -> Layout:
        fields, pack, offset, align = None, 8, 0, 1
        for statement in node.body:
            if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                if statement.targets[0].id == "_fields_":
                    fields = statement.value
                elif statement.targets[0].id == "_pack_":
                    pack = ast.literal_eval(statement.value)
        out = []
        for name, kind in self._fields(fields):
            size, natural = self.size_of(kind)
            field_align = min(natural, pack)
            offset = -(-offset // field_align) * field_align
            out.append(Field(name, offset, size))
            offset += size
            align = max(align, field_align)
        return Layout(node.name, -(-offset // align) * align, align, tuple(out))

    def _fields(self, node: ast.expr) -> list[tuple[str, ast.expr]]:
        if isinstance(node, ast.List):
            return [(ast.literal_eval(item.elts[0]), item.elts[1]) for item in node.elts]
        if isinstance(node, ast.ListComp):  # [(name, T) for name in (...)]
            (generator,) = node.generators
            names = ast.literal_eval(generator.iter)
            return [(name, node.elt.elts[1]) for name in names]
        raise ValueError(f"cannot read the fields {ast.dump(node)[:80]}")

    def size_of(self, kind: ast.expr) -> tuple[int, int]:
        """(size, alignment) on Windows x64 of a field type as written."""
        if isinstance(kind, ast.Attribute) and isinstance(kind.value, ast.Name) \
                and kind.value.id == "ctypes":
            size = WINDOWS_SIZES[kind.attr]
            return size, size
        if isinstance(kind, ast.Call):  # ctypes.POINTER(T)
            return POINTER, POINTER
        if isinstance(kind, ast.BinOp) and isinstance(kind.op, ast.Mult):  # T * n
            size, align = self.size_of(kind.left)
            return size * ast.literal_eval(kind.right), align
        if isinstance(kind, ast.Name):
            if kind.id in self.classes:
                layout = self.layout(kind.id)
                return layout.size, layout.align
            return self.size_of(self.aliases[kind.id])
        raise ValueError(f"unknown field type {ast.dump(kind)[:80]}")


def constants() -> dict[str, int]:
    return {name: value for name, value in vars(c).items() if name.isupper()}


def c_source(layouts: list[Layout] | None = None, values: dict[str, int] | None = None,
             functions: list[str] | None = None, headers: tuple[str, ...] = ()) -> str:
    """The C file: static assertions on `layouts`, `values` (default: structs.py's, constants.py's)
    and declarations of `functions` (default: api.py's), with `headers` included too."""
    layouts = Layouts().all() if layouts is None else layouts
    values = constants() if values is None else values
    functions = list(api._SIGNATURES) if functions is None else functions
    lines = [PREAMBLE, *(f"#include <{h}>" for h in HEADERS + headers), "#include <stddef.h>",
             ""]
    for layout in layouts:
        t = layout.name
        lines.append(f'_Static_assert(sizeof({t}) == {layout.size}, "sizeof({t})");')
        for f in layout.fields:
            lines.append(f'_Static_assert(offsetof({t}, {f.name}) == {f.offset}, '
                         f'"offsetof({t}, {f.name})");')
            lines.append(f'_Static_assert(sizeof((({t} *)0)->{f.name}) == {f.size}, '
                         f'"sizeof({t}.{f.name})");')
    for name, value in values.items():
        if name in BIT_FIELDS:
            structure, field = BIT_FIELDS[name]
            lines.append(f"const {structure} stockade_bit_{name} = {{.{field} = 1}};")
            continue
        expression = HEADER_EXPRESSIONS.get(name, name)
        lines.append(f"_Static_assert((unsigned long long)(unsigned int)({expression}) == "
                     f"{value}ULL || (unsigned long long)({expression}) == {value}ULL, "
                     f'"{name}");')
    lines.append("void stockade_bound(void) {")
    lines += [f"    (void)&{name};" for name in functions]
    lines.append("}")
    return "\n".join(lines) + "\n"


def bit_field_values(assembly: str) -> dict[str, int]:
    """The value each `stockade_bit_NAME` object was initialised to, from gcc's assembly."""
    values, current = {}, None
    for line in assembly.splitlines():
        text = line.strip()
        if text.startswith("stockade_bit_") and text.endswith(":"):
            current = text[len("stockade_bit_"):-1]
        elif current and text.startswith((".long", ".byte", ".word", ".quad")):
            values[current] = int(text.split()[1], 0)
            current = None
    return values


def check_local_sizes() -> None:
    """The sizes here agree with this platform's where LLP64 and LP64 agree (a sanity check of
    the table, which must not be used for the Windows-only differences)."""
    for name, size in WINDOWS_SIZES.items():
        if name not in ("c_long", "c_ulong", "c_wchar"):
            assert ctypes.sizeof(getattr(ctypes, name)) == size, name
