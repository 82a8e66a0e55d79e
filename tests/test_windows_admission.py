"""Path admission before any access-control change: paths as written, and what is on disk
(a model volume with junctions, symbolic links, mount points and hard links)."""

from __future__ import annotations

import pytest
from test_windows_fakes import FakeTree

from stockade.windows import admission
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
