"""argv -> Windows command line, checked by parsing it back with a reimplementation of the
documented parsing rules (CommandLineToArgvW and the Microsoft C runtime), and the program
lookup CreateProcessW is given instead of searching by itself."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stockade.errors import StartError
from stockade.windows.cmdline import command_line, resolve_program


def parse(line: str) -> list[str]:
    """The documented rules: argv[0] runs to the next quote if it starts with one (no escapes),
    else to the first space or tab. After it, arguments are split on unquoted spaces and tabs;
    2n backslashes before a quote give n backslashes and the quote toggles quoting, 2n+1 give n
    and a literal quote; other backslashes are literal; inside quotes, `""` is a literal quote
    that also ends the quoted part."""
    n = len(line)
    if line.startswith('"'):
        end = line.find('"', 1)
        end = n if end < 0 else end
        args, i = [line[1:end]], end + 1
    else:
        end = 0
        while end < n and line[end] not in " \t":
            end += 1
        args, i = [line[:end]], end
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return args
        arg, quoted = [], False
        while i < n:
            char = line[i]
            if char == "\\":
                j = i
                while j < n and line[j] == "\\":
                    j += 1
                if j < n and line[j] == '"':
                    arg.append("\\" * ((j - i) // 2))
                    if (j - i) % 2:
                        arg.append('"')
                        j += 1
                else:
                    arg.append("\\" * (j - i))
                i = j
            elif char == '"':
                if quoted and i + 1 < n and line[i + 1] == '"':
                    arg.append('"')
                    i += 2
                    quoted = False
                else:
                    quoted = not quoted
                    i += 1
            elif char in " \t" and not quoted:
                break
            else:
                arg.append(char)
                i += 1
        args.append("".join(arg))


# The examples of Microsoft's "Parsing C command-line arguments", after a program name.
@pytest.mark.parametrize(("line", "argv"), [
    ('"a b c" d e', ["a b c", "d", "e"]),
    ('"ab\\"c" "\\\\" d', ['ab"c', "\\", "d"]),
    ('a\\\\\\b d"e f"g h', ["a\\\\\\b", "de fg", "h"]),
    ('a\\\\\\"b c d', ['a\\"b', "c", "d"]),
    ('a\\\\\\\\"b c" d e', ["a\\\\b c", "d", "e"]),
    ('a"b"" c d', ['ab"', "c", "d"]),
])
def test_the_parser_agrees_with_the_documented_examples(line, argv):
    assert parse("prog " + line) == ["prog", *argv]


def test_the_parser_reads_argv0_without_escapes():
    assert parse('"C:\\Program Files\\x\\" a') == ["C:\\Program Files\\x\\", "a"]
    assert parse("C:\\x\\y.exe\tz") == ["C:\\x\\y.exe", "z"]


TRICKY = [
    ["prog"],
    ["prog", ""],
    ["prog", "", ""],
    ["prog", "a b"],
    ["prog", "a\tb"],
    ["prog", "a\nb", "a\vb"],
    ["prog", '"'],
    ["prog", '""'],
    ["prog", '"a"'],
    ["prog", "\\"],
    ["prog", "\\\\"],
    ["prog", "a\\"],
    ["prog", "a b\\"],
    ["prog", "a b\\\\"],
    ["prog", 'a\\"b'],
    ["prog", 'a\\\\"b'],
    ["prog", '\\"'],
    ["prog", 'x" & whoami & "'],
    ["prog", "C:\\Program Files\\"],
    ["prog", "C:\\dir\\", "next"],
    ["prog", "%PATH%", "!x!", "^", "&|<>()"],
    ["prog", "  leading", "trailing  "],
    ["prog", "ünïcödé", "日本語", "emoji 😀"],
    ["C:\\Program Files\\App\\app.exe", "x"],
    ["C:\\dir with space\\", "x"],
    ["C:\\dir\\"],
    ["prog", "-c", "import sys; print(sys.argv)"],
    ["prog", "--opt=a b", '--json={"k": "v w"}'],
]


@pytest.mark.parametrize("argv", TRICKY)
def test_tricky_argv_round_trip(argv):
    assert parse(command_line(argv)) == argv


ARGS = st.text(alphabet=st.sampled_from(list(' \t\n\v"\\ab&%^é😀')), max_size=12)


@given(st.text(alphabet=st.sampled_from(list("ab \t\\:.é")), min_size=1, max_size=10),
       st.lists(ARGS, max_size=6))
@example("a", ["\\\\\\", '\\"\\'])
def test_any_argv_round_trips(argv0, rest):
    argv = [argv0, *rest]
    assert parse(command_line(argv)) == argv


def test_plain_arguments_stay_bare():
    assert command_line(["prog", "-x", "a.txt", "C:\\dir\\f"]) == "prog -x a.txt C:\\dir\\f"


@pytest.mark.parametrize("argv", [[], [""], ['pro"g'], ["prog", "a\0b"]])
def test_argv_no_command_line_can_carry_is_refused(argv):
    with pytest.raises(ValueError):
        command_line(argv)


def test_the_cmd_exe_caveat_is_what_the_docstring_says():
    line = command_line(["cmd.exe", "/d", "/c", "echo", 'x" & whoami & "'])
    assert line == 'cmd.exe /d /c echo "x\\" & whoami & \\""'
    # cmd.exe toggles its quoting at every ", backslash or not: the & is outside its quotes.
    assert line[:line.index("&")].count('"') % 2 == 0


def files(*paths: str):
    known = {p.casefold() for p in paths}
    return lambda path: path.casefold() in known


ENV = (("PATH", "C:\\Windows\\system32;relative;C:\\tools"), ("PATHEXT", ".EXE;.CMD"))


def resolved(argv0: str, cwd: str, env, is_file) -> str:
    """resolve_program's answer, case-folded: Windows paths compare without regard to case
    (PATHEXT's extensions are appended as PATHEXT spells them)."""
    return resolve_program(argv0, cwd, env, is_file).casefold()


def test_a_bare_name_is_searched_in_the_sandboxs_path_with_pathext():
    is_file = files("C:\\tools\\git.exe", "C:\\ws\\git.exe", "relative\\git.exe")
    assert resolved("git", "C:\\ws", ENV, is_file) == "c:\\tools\\git.exe"


def test_the_current_directory_and_relative_path_entries_are_never_searched():
    with pytest.raises(StartError) as refused:
        resolve_program("git", "C:\\ws", ENV, files("C:\\ws\\git.exe", "relative\\git.exe"))
    assert refused.value.code == "command_not_found"


def test_a_name_with_an_extension_is_tried_as_is_and_path_names_are_relative_to_cwd():
    is_file = files("C:\\Windows\\system32\\cmd.exe", "C:\\ws\\bin\\tool.exe",
                    "C:\\ws\\run.cmd")
    assert resolve_program("cmd.exe", "C:\\ws", ENV, is_file) == \
        "C:\\Windows\\system32\\cmd.exe"
    assert resolved("bin\\tool", "C:\\ws", ENV, is_file) == "c:\\ws\\bin\\tool.exe"
    assert resolve_program(".\\run.cmd", "C:\\ws", ENV, is_file) == "C:\\ws\\run.cmd"
    assert resolved("C:\\ws\\bin\\..\\run", "C:\\other", ENV, is_file) == "c:\\ws\\run.cmd"


def test_path_and_pathext_are_read_without_regard_to_case_and_default_sensibly():
    env = (("Path", "C:\\bin"),)
    assert resolved("x", "C:\\", env, files("C:\\bin\\x.bat")) == "c:\\bin\\x.bat"
    with pytest.raises(StartError):
        resolve_program("x", "C:\\", (), files("C:\\bin\\x.exe"))
