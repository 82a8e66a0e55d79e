"""The environment block: sorted as Windows sorts it, NUL-separated, refusing what Windows
cannot hold."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.windows.envblock import environment_block, with_temp


def names(block: str) -> list[str]:
    assert block.endswith("\0\0") or block == "\0"
    return [entry.split("=", 1)[0] for entry in block[:-1].split("\0")[:-1]]


def test_the_block_is_name_value_pairs_each_ended_by_nul_then_one_more_nul():
    block = environment_block((("PATH", "C:\\bin"), ("A", "x=y")))
    assert block == "A=x=y\0PATH=C:\\bin\0\0"


def test_an_empty_environment_is_a_single_nul():
    assert environment_block(()) == "\0"


def test_names_sort_without_regard_to_case_as_upper_cased_code_units():
    env = (("b", "1"), ("A", "2"), ("_x", "3"), ("Z", "4"), ("a_", "5"), ("ä", "6"))
    # Upper-cased: "B", "A", "_X", "Z", "A_", "Ä" -> A < A_ < B < Z < _X (0x5F) < Ä (0xC4)
    assert names(environment_block(env)) == ["A", "a_", "b", "Z", "_x", "ä"]


def test_the_sort_differs_from_pythons_default_sort_where_windows_needs_it():
    env = (("path", "1"), ("PYTHONUTF8", "2"), ("SystemRoot", "3"), ("TEMP", "4"))
    assert sorted(n for n, _ in env) == ["PYTHONUTF8", "SystemRoot", "TEMP", "path"]
    assert names(environment_block(env)) == ["path", "PYTHONUTF8", "SystemRoot", "TEMP"]


def test_names_outside_the_basic_plane_sort_by_their_code_units():
    env = (("\U0001F600", "1"), ("\uFFFD", "2"), ("Z", "3"))
    # U+1F600 is the surrogate pair D83D DE00, which sorts below U+FFFD.
    assert names(environment_block(env)) == ["Z", "\U0001F600", "\uFFFD"]


@pytest.mark.parametrize(("env", "named"), [
    ((("", "x"),), "''"),
    ((("=C:", "C:\\"),), "'=C:'"),
    ((("A=B", "x"),), "'A=B'"),
    ((("A\0B", "x"),), "'A\\x00B'"),
    ((("SECRET_NAME", "a\0b"),), "SECRET_NAME"),
    ((("Path", "1"), ("PATH", "2")), "Path and PATH"),
])
def test_what_windows_cannot_hold_is_refused_naming_the_variable_never_its_value(env, named):
    with pytest.raises(ValueError) as refused:
        environment_block(env)
    assert named in str(refused.value)
    assert all(value not in str(refused.value) for _, value in env if len(value) > 1)


@given(st.dictionaries(st.text(st.characters(blacklist_characters="=\0"), min_size=1),
                       st.text(st.characters(blacklist_characters="\0"))))
def test_any_valid_environment_round_trips(variables):
    folded = {}
    for name, value in variables.items():
        folded.setdefault(name.upper(), (name, value))
    env = tuple(folded.values())
    try:
        block = environment_block(env)
    except ValueError as exc:  # two names that upper-case alike code unit by code unit
        assert "differ only in case" in str(exc)
        return
    entries = [tuple(entry.split("=", 1)) for entry in block[:-1].split("\0")[:-1]]
    assert sorted(entries) == sorted(env)


@given(st.dictionaries(st.text("abcXYZ_09[]~", min_size=1, max_size=6), st.just("v")))
def test_ascii_names_come_in_the_order_of_their_upper_case_forms(variables):
    folded = {name.upper(): name for name in variables}
    block = environment_block(tuple((name, "v") for name in folded.values()))
    assert names(block) == sorted(folded.values(), key=str.upper)


def test_the_launch_gets_its_own_temp_unless_the_policy_names_one():
    # (issue 31, L12) the owner's TEMP is outside every root; without one, Python's tempfile
    # falls back to the working directory, the workspace
    temp = "C:\\Users\\u\\AppData\\Local\\Packages\\stockade-ac-0\\AC\\Temp"
    env = (("PATH", "C:\\Windows\\System32"),)
    assert names(environment_block(with_temp(env, temp))) == ["PATH", "TEMP", "TMP"]
    assert dict(with_temp(env, temp)) == {"PATH": "C:\\Windows\\System32", "TEMP": temp,
                                          "TMP": temp}
    mine = (("Temp", "C:\\ws\\tmp"),)  # a policy's own, in any case
    assert with_temp(mine, temp) == (("Temp", "C:\\ws\\tmp"), ("TMP", temp))


def test_the_windows_presets_variables_are_passed_whatever_their_case_in_the_owners_env(
        monkeypatch):
    # (issue 31, L12) CPython's os.environ on Windows holds every name upper-cased (os.py's
    # encodekey), so dict(os.environ), the host environment compile reads, has SYSTEMROOT,
    # COMSPEC and WINDIR: the preset's SystemRoot, ComSpec and windir never matched, and a
    # child without SystemRoot cannot start Winsock
    from stockade.launch.env import close_environment
    from stockade.policy.presets import WINDOWS_ENV_PASS_DEFAULTS

    as_windows_gives = {"SystemRoot": "C:\\Windows", "ComSpec": "C:\\Windows\\system32\\cmd.exe",
                        "windir": "C:\\Windows", "SystemDrive": "C:", "Path": "C:\\Windows",
                        "PATHEXT": ".COM;.EXE", "USERPROFILE": "C:\\Users\\u",
                        "PROCESSOR_ARCHITECTURE": "AMD64", "NUMBER_OF_PROCESSORS": "4",
                        "TEMP": "C:\\Users\\u\\AppData\\Local\\Temp", "SECRET_THING": "x"}
    host = {name.upper(): value for name, value in as_windows_gives.items()}
    monkeypatch.setattr(sys, "platform", "win32")
    env = dict(close_environment(WINDOWS_ENV_PASS_DEFAULTS, (), host))
    assert env == {("PATH" if name == "Path" else name): value
                   for name, value in as_windows_gives.items()
                   if name not in ("TEMP", "SECRET_THING")}
    monkeypatch.setattr(sys, "platform", "linux")  # elsewhere names keep their case
    assert "SystemRoot" not in dict(close_environment(("SystemRoot",), (), host))
