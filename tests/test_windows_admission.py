"""Path admission before any access-control change: paths as written, and what is on disk
(a model volume with junctions, symbolic links, mount points and hard links)."""

from __future__ import annotations

import contextlib
import ntpath
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
from test_windows_fakes import FakeTree

from stockade.errors import StartError
from stockade.launch import hostpaths
from stockade.launch.request import LaunchRequest, PathGrant
from stockade.windows import admission, fsinfo, program
from stockade.windows import constants as c
from stockade.windows.admission import Entry


@pytest.mark.parametrize("path", [
    "C:\\", "C:\\Users\\me\\ws", "D:\\build\\out.dir", "C:\\a b\\c-d_e", "C:\\Users\\me\\.git",
    "C:\\x\\ünïcödé\\日本", "C:\\Program Files (x86)\\App", "C:\\x\\con-figs", "C:\\x\\nullable",
    "C:\\x\\a~b", "C:\\x\\file~1x.txt", "C:\\x\\com10",
])
def test_canonical_drive_paths_are_admitted(path):
    assert admission.lexical_refusal(path) is None


@pytest.mark.parametrize(("path", "reason"), [
    ("\\\\server\\share\\ws", "UNC"),
    ("//server/share/ws", "UNC"),
    ("\\\\?\\C:\\ws", "device"),
    ("\\\\?\\UNC\\server\\share", "device"),
    ("\\\\.\\C:\\ws", "device"),
    ("\\\\.\\PhysicalDrive0", "device"),
    ("\\??\\C:\\ws", "device"),
    ("//?/C:/ws", "device"),
    ("C:ws", "absolute drive"),
    ("\\ws", "absolute drive"),
    ("ws", "absolute drive"),
    ("/home/me/ws", "absolute drive"),
    ("C:/Users/me", "absolute drive"),
    ("C:\\Users/me", "canonical"),
    ("C:\\Users\\me\\..\\you", "canonical"),
    ("C:\\Users\\me\\.\\ws", "canonical"),
    ("C:\\Users\\me\\", "canonical"),
    ("C:\\Users\\\\me", "canonical"),
    ("C:\\ws\\file.txt:secret", "data stream"),
    ("C:\\ws\\file.txt::$DATA", "data stream"),
    ("C:\\ws\\a*b", "reserved character"),
    ("C:\\ws\\a?b", "reserved character"),
    ("C:\\ws\\a\x01b", "reserved character"),
    ("C:\\ws\\trailing.", "dot or a space"),
    ("C:\\ws\\trailing ", "dot or a space"),
    ("C:\\ws\\NUL", "device name"),
    ("C:\\ws\\nul.txt", "device name"),
    ("C:\\ws\\CON", "device name"),
    ("C:\\ws\\aux.tar.gz", "device name"),
    ("C:\\ws\\com1", "device name"),
    ("C:\\ws\\LPT9.log", "device name"),
    ("C:\\ws\\COM¹", "device name"),
    ("C:\\ws\\conin$", "device name"),
    ("C:\\PROGRA~1\\App", "8.3"),
    ("C:\\Users\\RUNNER~1\\ws", "8.3"),
    ("C:\\ws\\GIT~1", "8.3"),
    ("C:\\ws\\ABCDEF~12.TXT", "8.3"),
])
def test_paths_that_alias_or_escape_are_refused(path, reason):
    why = admission.lexical_refusal(path)
    assert why is not None and reason in why


def test_a_short_looking_name_the_filesystem_confirms_as_the_long_name_is_admitted():
    assert admission.lexical_refusal("C:\\ws\\build~1", lambda p: p.upper()) is None
    assert admission.lexical_refusal("C:\\PROGRA~1\\App",
                                     lambda p: "C:\\Program Files\\App") is not None


def test_only_ntfs_and_refs_are_supported():
    assert admission.filesystem_refusal("NTFS") is None
    assert admission.filesystem_refusal("ReFS") is None
    for other in ("FAT32", "exFAT", "", "ntfs", "CDFS"):
        assert admission.filesystem_refusal(other) is not None


@pytest.mark.parametrize(("entry", "capability"), [
    (Entry("C:\\ws\\j", True, c.FILE_ATTRIBUTE_REPARSE_POINT | 0x10, 0xA0000003),
     "filesystem.reparse_point"),                                      # junction, mount point
    (Entry("C:\\ws\\l", False, c.FILE_ATTRIBUTE_REPARSE_POINT, 0xA000000C),
     "filesystem.reparse_point"),                                      # symbolic link
    (Entry("C:\\ws\\s", False, c.FILE_ATTRIBUTE_REPARSE_POINT, 0x80000023),
     "filesystem.reparse_point"),                                      # AF_UNIX socket
    (Entry("C:\\ws\\f", False, 0x20, 0, 2), "filesystem.hard_link"),
    (Entry("C:\\ws\\f", False, 0x20, 0, 1023), "filesystem.hard_link"),
])
def test_reparse_points_and_multiply_linked_files_are_refused(entry, capability):
    refusal = admission.entry_refusal(entry)
    assert refusal is not None and refusal[0] == capability and entry.path in refusal[1]


def test_multiply_linked_files_are_admitted_in_read_roots_only():
    linked = Entry("C:\\env\\Lib\\six.py", False, 0x20, 0, 2)
    assert admission.entry_refusal(linked, write=False) is None
    refusal = admission.entry_refusal(linked, write=True)
    assert refusal is not None and refusal[0] == "filesystem.hard_link"
    assert "UV_LINK_MODE=copy" in refusal[1]
    junction = Entry("C:\\env\\j", True, c.FILE_ATTRIBUTE_REPARSE_POINT | 0x10, 0xA0000003)
    assert admission.entry_refusal(junction, write=False) is not None


def test_plain_files_and_directories_pass():
    assert admission.entry_refusal(Entry("C:\\ws\\f", False, 0x20, 0, 1)) is None
    assert admission.entry_refusal(Entry("C:\\ws\\d", True, 0x10, 0, 5)) is None  # dirs: any


def test_the_walk_visits_parents_first_and_never_enters_a_reparse_point():
    tree = FakeTree.volume()
    tree.add("C:\\ws")
    tree.add("C:\\ws\\a")
    tree.file("C:\\ws\\a\\f")
    tree.add("C:\\ws\\junction", reparse_tag=0xA0000003)
    tree.file("C:\\ws\\junction\\beyond")
    tree.file("C:\\ws\\z")
    walked = [e.path for e in admission.walk("C:\\ws", tree.scan, tree.entry)]
    assert walked == ["C:\\ws", "C:\\ws\\a", "C:\\ws\\a\\f", "C:\\ws\\junction", "C:\\ws\\z"]


def test_the_walk_yields_the_root_even_when_it_is_itself_a_reparse_point():
    tree = FakeTree.volume()
    tree.add("C:\\link", reparse_tag=0xA000000C)
    tree.file("C:\\link\\inside")
    assert [e.path for e in admission.walk("C:\\link", tree.scan, tree.entry)] == ["C:\\link"]


def test_inside_compares_components_without_regard_to_case():
    assert admission.inside("C:\\Users\\Me\\WS\\x", "c:\\users\\me\\ws")
    assert admission.inside("C:\\ws", "C:\\WS")
    assert admission.inside("C:\\anything", "C:\\")
    assert not admission.inside("C:\\ws2", "C:\\ws")
    assert not admission.inside("D:\\ws", "C:\\ws")


def test_names_compare_as_windows_compares_them_not_as_casefold_does():
    # NTFS upper-cases each UTF-16 unit on its own through the volume's upcase table: "ß" has
    # no one-unit upper case, so "straße" and "STRASSE" are two names (casefold: one).
    assert hostpaths.upcase("straße") != hostpaths.upcase("STRASSE")
    assert hostpaths.upcase(".git") == hostpaths.upcase(".GIT")
    assert hostpaths.upcase("ünïcödé") == hostpaths.upcase("ÜNÏCÖDÉ")
    assert hostpaths.upcase("\U0001F600x") == "\ud83d\ude00X"  # (surrogates as they are)
    assert not admission.inside("C:\\ws\\STRASSE\\x", "C:\\ws\\straße")
    assert admission.inside("C:\\WS\\Ünï\\x", "c:\\ws\\ünï")


# --- reparse points told apart by tag (issue 31, L11) ------------------------------------------

CLOUD_TAGS = [c.IO_REPARSE_TAG_CLOUD | variant << 12 for variant in range(16)]  # CLOUD, _1.._F
REPARSE = c.FILE_ATTRIBUTE_REPARSE_POINT
STORE_PYTHON = ("C:\\Program Files\\WindowsApps\\PythonSoftwareFoundation.Python.3.12_"
                "3.12.2800.0_x64__qbz5n2kfra8p0\\python3.12.exe")
ALIASES = "C:\\Users\\u\\AppData\\Local\\Microsoft\\WindowsApps"


@pytest.mark.parametrize("tag", [c.IO_REPARSE_TAG_WOF, c.IO_REPARSE_TAG_DEDUP])
def test_compressed_and_deduplicated_files_are_admitted_like_any_file(tag):
    # (L11) `compact /c /exe` (or CompactOS) turns a Python install's files into WOF reparse
    # points, Data Deduplication a Server volume's files into DEDUP ones: each the file
    # itself (no name-surrogate bit), read through its filter. Before, either refused the root.
    entry = Entry("C:\\py\\python313.dll", False, REPARSE | 0x20, tag)
    assert admission.entry_refusal(entry, write=False) is None
    assert admission.entry_refusal(entry) is None
    assert not tag & 0x20000000  # (winnt.h: IsReparseTagNameSurrogate)
    tree = FakeTree.volume()
    tree.add("C:\\py")
    tree.file("C:\\py\\python313.dll", reparse_tag=tag)
    assert [e.path for e in admission.walk("C:\\py", tree.scan, tree.entry)] == [
        "C:\\py", "C:\\py\\python313.dll"]


@pytest.mark.parametrize("tag", CLOUD_TAGS)
def test_onedrive_placeholders_are_admitted_like_any_file_or_directory(tag):
    # winnt.h: IO_REPARSE_TAG_CLOUD 0x9000001A, CLOUD_1 ... CLOUD_F 0x9000101A ... 0x9000F01A
    # (no name-surrogate bit; the directory bit set, as a placeholder folder has children).
    assert admission.entry_refusal(Entry("C:\\Users\\u\\OneDrive\\ws", True,
                                         REPARSE | 0x10, tag)) is None
    assert admission.entry_refusal(Entry("C:\\Users\\u\\OneDrive\\ws\\f.py", False,
                                         REPARSE | 0x20, tag)) is None
    refusal = admission.entry_refusal(Entry("C:\\x\\f", False, REPARSE, tag, 2))
    assert refusal is not None and refusal[0] == "filesystem.hard_link"


@pytest.mark.parametrize("tag", [
    c.IO_REPARSE_TAG_MOUNT_POINT, c.IO_REPARSE_TAG_SYMLINK,
    0x9000001C, 0x80000023,  # ProjFS, AF_UNIX (WOF and dedup: admitted, see above)
    0xA000001A, 0xB000001A, 0x9001001A, 0x1A, 0,  # look-alikes of the cloud tag; no tag read
])
def test_every_other_reparse_point_is_still_refused(tag):
    refusal = admission.entry_refusal(Entry("C:\\ws\\x", True, REPARSE | 0x10, tag))
    assert refusal is not None and refusal[0] == "filesystem.reparse_point"


def test_an_app_execution_alias_in_a_root_is_refused_with_a_remedy():
    alias = Entry(ALIASES + "\\python.exe", False, REPARSE | 0x20, c.IO_REPARSE_TAG_APPEXECLINK)
    capability, reason = admission.entry_refusal(alias)
    assert capability == "filesystem.reparse_point"
    assert "app execution alias" in reason and "name the program it opens" in reason


def test_the_walk_enters_a_onedrive_folder_but_no_other_reparse_point():
    tree = FakeTree.volume()
    tree.add("C:\\od", reparse_tag=c.IO_REPARSE_TAG_CLOUD)
    tree.add("C:\\od\\docs", reparse_tag=c.IO_REPARSE_TAG_CLOUD | 0x3000)
    tree.file("C:\\od\\docs\\a.txt", reparse_tag=c.IO_REPARSE_TAG_CLOUD | 0x3000)
    tree.add("C:\\od\\junction", reparse_tag=c.IO_REPARSE_TAG_MOUNT_POINT)
    tree.file("C:\\od\\junction\\beyond")
    walked = [e.path for e in admission.walk("C:\\od", tree.scan, tree.entry)]
    assert walked == ["C:\\od", "C:\\od\\docs", "C:\\od\\docs\\a.txt", "C:\\od\\junction"]


def alias_data(*strings: str, count: int | None = None, tag: int = 0x8000001B) -> bytes:
    """FSCTL_GET_REPARSE_POINT's answer for an app execution alias: the REPARSE_DATA_BUFFER
    header (tag, data length, reserved) and the alias's data, a ULONG string count and the
    NUL-terminated UTF-16 strings (the layout libuv and CPython's launcher read)."""
    body = (len(strings) if count is None else count).to_bytes(4, "little") + b"".join(
        (s + "\0").encode("utf-16-le") for s in strings)
    return tag.to_bytes(4, "little") + len(body).to_bytes(2, "little") + bytes(2) + body


STORE_ALIAS = ("PythonSoftwareFoundation.Python.3.12_qbz5n2kfra8p0",
               "PythonSoftwareFoundation.Python.3.12_qbz5n2kfra8p0!Python", STORE_PYTHON, "0")


def test_an_app_execution_alias_names_its_program():
    assert admission.app_link_target(alias_data(*STORE_ALIAS)) == STORE_PYTHON
    assert admission.app_link_target(alias_data(*STORE_ALIAS) + bytes(64)) == STORE_PYTHON


@pytest.mark.parametrize("data", [
    alias_data(*STORE_ALIAS, tag=c.IO_REPARSE_TAG_SYMLINK),  # not an alias
    alias_data(*STORE_ALIAS[:2]),  # no program
    alias_data(*STORE_ALIAS, count=2),
    alias_data(*STORE_ALIAS)[:40],  # cut short
    alias_data("p", "a", "python3.12.exe", "0"),  # relative
    alias_data("p", "a", "\\\\server\\share\\python.exe", "0"),  # UNC
    alias_data("p", "a", "C:\\PROGRA~1\\WindowsApps\\python.exe", "0"),  # a short name
    b"",
])
def test_anything_else_in_an_alias_is_not_trusted(data):
    assert admission.app_link_target(data) is None


class WindowsOs:
    """`os.scandir` and `os.lstat` as CPython on Windows answers them, over `nodes` (path ->
    attributes, reparse tag, link count). A listing is FindFirstFileW's data: attributes and
    the tag (dwReserved0), st_nlink 0 (as Python documents for DirEntry on Windows). `lstat`
    opens name surrogates (bit 29) as themselves, and resolves every other reparse point "as
    for stat()" (Python's os.lstat: "Changed in version 3.8"): a cloud placeholder opens as
    itself through the cloud filter and reports its attributes with tag 0 (the traversing
    open never asks for the tag); an alias cannot be opened that way (ERROR_CANT_ACCESS_FILE)
    and is opened as itself, its tag reported."""

    def __init__(self, nodes: dict[str, tuple[int, int, int]]) -> None:
        self.nodes = nodes

    def scandir(self, directory: str):
        entries = [_Listed(path, *self.nodes[path]) for path in self.nodes
                   if ntpath.dirname(path) == directory and path != directory]
        return contextlib.nullcontext(entries)

    def lstat(self, path: str) -> SimpleNamespace:
        attributes, tag, links = self.nodes[path]
        surrogate, alias = tag & 0x20000000, tag == c.IO_REPARSE_TAG_APPEXECLINK
        shown = tag if attributes & REPARSE and (surrogate or alias) else 0
        return SimpleNamespace(st_file_attributes=attributes, st_reparse_tag=shown,
                               st_nlink=links, st_mode=0o40777 if attributes & 0x10 else 0o100666,
                               st_dev=0x5EED, st_ino=sorted(self.nodes).index(path) + 1)


@dataclass
class _Listed:
    path: str
    attributes: int
    tag: int
    links: int

    @property
    def name(self) -> str:
        return ntpath.basename(self.path)

    def stat(self, *, follow_symlinks: bool = True) -> SimpleNamespace:
        assert not follow_symlinks
        return SimpleNamespace(st_file_attributes=self.attributes, st_reparse_tag=self.tag,
                               st_nlink=0, st_mode=0)


def test_fsinfo_reads_each_entrys_own_tag_without_following_it(monkeypatch):
    od = "C:\\Users\\u\\OneDrive"
    cloud = c.IO_REPARSE_TAG_CLOUD | 0x2000
    windows = WindowsOs({
        "C:\\": (0x10, 0, 1), od: (REPARSE | 0x10, cloud, 1),
        od + "\\notes.txt": (REPARSE | 0x20, cloud, 1), od + "\\plain": (0x20, 0, 2),
        od + "\\link": (REPARSE | 0x20, c.IO_REPARSE_TAG_SYMLINK, 1),
        od + "\\python.exe": (REPARSE | 0x20, c.IO_REPARSE_TAG_APPEXECLINK, 1)})
    monkeypatch.setattr(fsinfo, "os", windows)
    root = fsinfo.entry(od)
    assert (root.is_dir, root.reparse_tag) == (True, cloud)
    assert admission.entry_refusal(root) is None
    listed = {e.name: e for e in fsinfo.scan(od)}
    assert listed["notes.txt"].reparse_tag == cloud and listed["notes.txt"].links == 1
    assert admission.entry_refusal(listed["notes.txt"]) is None
    assert listed["plain"].links == 2  # (from lstat: a listing holds no link count)
    assert listed["link"].reparse_tag == c.IO_REPARSE_TAG_SYMLINK
    assert admission.app_alias(listed["python.exe"])
    assert fsinfo.entry("C:\\").is_dir


def test_a_program_that_is_an_app_execution_alias_runs_as_its_program():
    req = LaunchRequest(
        argv=("python", "-V"), cwd="C:\\ws", env=(("PATH", ALIASES),),
        read=(PathGrant("C:\\Program Files", "C:\\Program Files"),),
        write=(PathGrant("C:\\ws", "C:\\ws"),))
    alias = ALIASES + "\\python.exe"

    def entry(path):
        assert path.casefold() == alias.casefold()
        return Entry(path, False, REPARSE | 0x20, c.IO_REPARSE_TAG_APPEXECLINK)

    def is_file(path):  # (PATHEXT's extensions are upper case: Windows names ignore case)
        return path.casefold() == alias.casefold()

    assert program.executable(req, is_file, entry, lambda path: STORE_PYTHON) == STORE_PYTHON
    with pytest.raises(StartError) as refused:
        program.executable(req, is_file, entry, lambda path: None)
    assert refused.value.code == "command_not_found" and "alias" in str(refused.value)
    with pytest.raises(StartError) as refused:
        program.executable(replace(req, read=()), is_file, entry, lambda path: STORE_PYTHON)
    assert refused.value.code == "command_not_found" and STORE_PYTHON in str(refused.value)
    plain = Entry(alias, False, 0x20)
    assert program.executable(replace(req, read=(PathGrant(ALIASES, ALIASES),)), is_file,
                             lambda path: plain, lambda path: STORE_PYTHON).casefold() \
        == alias.casefold()


def test_fsinfo_finds_a_root_by_its_own_name_in_a_case_sensitive_directory(monkeypatch):
    # `.git` and `.GIT` both listed (a case-sensitive directory): `.GIT` is that entry, not
    # the first whose name matches without regard to case; and a case no entry has there is
    # not found (a case-sensitive directory finds names exactly).
    windows = WindowsOs({"C:\\": (0x10, 0, 1), "C:\\ws": (0x10, 0, 1),
                         "C:\\ws\\.git": (0x10, 0, 1),
                         "C:\\ws\\.GIT": (REPARSE | 0x10, c.IO_REPARSE_TAG_MOUNT_POINT, 1)})
    monkeypatch.setattr(fsinfo, "os", windows)
    assert fsinfo.entry("C:\\ws\\.GIT").reparse_tag == c.IO_REPARSE_TAG_MOUNT_POINT
    assert fsinfo.entry("C:\\ws\\.git").reparse_tag == 0
    with pytest.raises(FileNotFoundError):
        fsinfo.entry("C:\\ws\\.Git")


class NoLongPaths(WindowsOs):
    """WindowsOs on a host without LongPathsEnabled (the default): a path of MAX_PATH (260
    with the NUL) or more is not found (ERROR_PATH_NOT_FOUND), a directory listed through a
    pattern (`DIR\\*`) the same; a path in the Win32 file namespace (`\\\\?\\C:\\...`) is
    taken as it is, any length, and a listing's entries carry the directory as it was given."""

    LONG = "\\\\?\\"

    def _path(self, path: str, extra: int = 0) -> str:
        if path.startswith(self.LONG):
            return path[len(self.LONG):]
        if len(path) + extra + 1 > 260:
            raise FileNotFoundError(2, "The system cannot find the path specified", path)
        return path

    def scandir(self, directory: str):
        prefix = self.LONG if directory.startswith(self.LONG) else ""
        with super().scandir(self._path(directory, len("\\*"))) as entries:
            return contextlib.nullcontext([replace(e, path=prefix + e.path) for e in entries])

    def lstat(self, path: str) -> SimpleNamespace:
        return super().lstat(self._path(path))


def test_roots_and_entries_past_max_path_are_walked_through_the_win32_namespace(monkeypatch):
    # (WINREAD 5) A deep node_modules or a long-named checkout passes 260 characters; every
    # call fsinfo makes for it failed on a host without LongPathsEnabled.
    parts = ["C:\\ws", *(["node_modules", "pkg" + "x" * 30] * 8)]
    nodes = {"C:\\": (0x10, 0, 1)}
    for depth in range(1, len(parts) + 1):
        nodes["\\".join(parts[:depth])] = (0x10, 0, 1)
    deepest = "\\".join(parts) + "\\index.js"
    nodes[deepest] = (0x20, 0, 1)
    assert len(deepest) > 380
    monkeypatch.setattr(fsinfo, "os", NoLongPaths(nodes))
    walked = [e.path for e in admission.walk("C:\\ws", fsinfo.scan, fsinfo.entry)]
    assert walked == sorted(nodes)[1:]  # every entry, each by its own (plain) name
    assert fsinfo.entry(deepest).file_id  # (lstat'd) and found as a root too
    assert fsinfo.win32_path(deepest) == "\\\\?\\" + deepest
    assert fsinfo.win32_path("C:\\ws") == "C:\\ws"


def test_dacl_and_long_name_calls_past_max_path_use_the_win32_namespace(monkeypatch):
    deep = "C:\\ws\\" + "\\".join(["y" * 60] * 5)
    asked: list[str] = []

    def create_file(path, *args):
        asked.append(path)
        if len(path) >= 260 and not path.startswith("\\\\?\\"):
            raise OSError(None, "The system cannot find the path specified", path, 3)
        return 7

    api = SimpleNamespace(CreateFileW=create_file, CloseHandle=lambda handle: None,
                          GetLongPathNameW=lambda path, buffer, size: (
                              setattr(buffer, "value", path), len(path))[1])
    monkeypatch.setattr(fsinfo, "win32", lambda: api)
    assert fsinfo.dacl_writable(deep) and asked == ["\\\\?\\" + deep]
    assert fsinfo.long_path(deep) == deep  # (the namespace prefix taken off again)
