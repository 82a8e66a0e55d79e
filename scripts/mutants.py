#!/usr/bin/env python3
"""Run the mutation suite (tests/mutants.py): each mutant is one careless line that removes a
security property SECURITY.md claims; it is applied alone to a private copy of the tree (never
to this checkout), the tests that own the property run there, and the mutant is *caught* when
one of them fails. The unmutated copy runs the same tests first: they must pass there, or a
catch would prove nothing.

    .venv-test/bin/python scripts/mutants.py            # every mutant ours to run
    .venv-test/bin/python scripts/mutants.py --list     # the table, nothing run
    .venv-test/bin/python scripts/mutants.py NAME ...   # these mutants only

Run it with the interpreter of the test venv (it runs pytest with the same one). The copies
import the package from themselves (the tests run with the copy as the current directory,
which `python -m pytest` puts first on sys.path; the sandbox's own processes import from
where the package lies). A mutant of a C source (the supervisor, the relay) has the programs
rebuilt in its copy, and the control then too. Exit status 0 only when every mutant run was
caught.
See docs/testing.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))

from mutants import INTEGRATIONS, MUTANTS, Mutant  # noqa: E402  (the table lives beside the tests)

# What a build made beside the sources and the tests need (git does not list it): copied into
# each copy, but built afresh in a copy whose C sources a mutant changed (and in the control then).
BUILT = ("stockade/linux/supervisor", "stockade/linux/librelay.so")
C_SOURCES = (".c", ".h")
TIMEOUT = 300  # seconds for one mutant's tests: a hang is reported as missed, never waited out


SKIPPED = (".git", ".venv", "__pycache__", "dist", "build")  # outside a checkout: not copied


def tracked_files(root: Path) -> list[str]:
    """The files git lists (every file but SKIPPED's in a copy that is no checkout, as the
    rootless copy scripts/test.sh makes), and what the build made."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=root, capture_output=True)
    if listed.returncode == 0:
        names = listed.stdout.decode().split("\0")
    else:
        names = walked_files(root)
    return [name for name in names
            if name and os.path.isfile(root / name)] + [b for b in BUILT if (root / b).exists()]


def walked_files(root: Path) -> list[str]:
    names = []
    for where, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(SKIPPED) and not d.endswith(".egg-info")]
        names += [str(Path(where, name).relative_to(root)) for name in files]
    return names


def copy_tree(names: list[str], source: Path, target: Path) -> None:
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, target / name)


def rebuilt(mutant: Mutant) -> bool:
    return mutant.path.endswith(C_SOURCES)


def build_programs(tree: Path) -> str:
    """Builds BUILT from `tree`'s C sources as an install does (pip's build of setup.py, in
    its own isolated build environment) and puts them in place of the copied ones: "" when
    both were made, else why not. setup.py makes both optional (an install without a compiler
    still succeeds), so a source that does not compile gives a wheel without its program: that
    is what is checked, and reported as a broken mutant, never as a catch."""
    wheels = tree.parent / f"{tree.name}.wheels"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                               "--disable-pip-version-check", "--wheel-dir", str(wheels),
                               str(tree)], env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=TIMEOUT)
        made = list(wheels.glob("stockade-*.whl"))
        if done.returncode != 0 or len(made) != 1:
            return f"pip wheel failed (status {done.returncode}): " + done.stdout[-500:]
        with zipfile.ZipFile(made[0]) as wheel:
            missing = [name for name in BUILT if name not in wheel.namelist()]
            for name in BUILT if not missing else ():
                (tree / name).write_bytes(wheel.read(name))
                (tree / name).chmod(0o755)
        errors = [line.strip() for line in done.stdout.splitlines() if " error: " in line]
        return (f"the build made no {', '.join(missing)}" + (f": {errors[0]}" if errors else "")
                if missing else "")
    except subprocess.TimeoutExpired:
        return f"the build took more than {TIMEOUT} s"
    finally:
        # (what the build left beside the sources: the copy stays as the others are)
        for left in (wheels, tree / "build", tree / "stockade.egg-info"):
            shutil.rmtree(left, ignore_errors=True)


def mutate(tree: Path, mutant: Mutant) -> None:
    path = tree / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: {mutant.path} holds the old text "
                         f"{text.count(mutant.old)} times, not once: the table is stale")
    path.write_text(text.replace(mutant.old, mutant.new))


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, float, str]:
    """(pytest's exit status, seconds, the test that failed or the tail of its output) for
    `tests` run in `tree`."""
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STOCKADE_STATE_DIR")}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p",
                               "no:cacheprovider", *tests], cwd=tree, env=env, text=True,
                              errors="replace",  # (a failure may quote what is not UTF-8)
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        status, output = -1, f"timed out after {TIMEOUT} s\n{exc.stdout or ''}"
    lines = str(output).strip().splitlines()
    failed = [line.split()[1] for line in lines if line.startswith("FAILED ")]
    said = failed[0] if failed else "\n".join(lines[-3:])
    return status, time.monotonic() - started, said


def imports_itself(tree: Path) -> bool:
    """Whether the tests in `tree` import the package from `tree` (not the checkout's)."""
    found = subprocess.run([sys.executable, "-c", "import stockade; print(stockade.__file__)"],
                           cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
    return Path(found).resolve().is_relative_to(tree.resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all ours)")
    parser.add_argument("--list", action="store_true", help="print the table, run nothing")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the run of the unmutated copy")
    parser.add_argument("--keep", action="store_true", help="keep the copies (for a look)")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    if args.list:
        for m in chosen:
            owner = f"  [{m.owner}]" if m.owner else ""
            owner += "  (programs rebuilt)" if rebuilt(m) else ""
            owner += "  (rootless only)" if m.rootless else ""
            print(f"{m.name}{owner}\n  {m.path}: {m.old.strip()!r} -> {m.new.strip()!r}\n  "
                  + "\n  ".join(m.tests))
        return 0
    # (a root run cannot catch one whose property exists only for a user who is not root)
    unrunnable = [m.name for m in chosen if m.rootless and not m.owner and os.getuid() == 0]
    # (one whose tests are the integrations' needs their frameworks: .venv-integrations)
    elsewhere = [] if importlib.util.find_spec("mcp") else [
        m.name for m in chosen if not m.owner and any(t.startswith(INTEGRATIONS) for t in m.tests)]
    ours = [m for m in chosen if not m.owner and m.name not in unrunnable + elsewhere]
    build = any(rebuilt(m) for m in ours)
    names = tracked_files(HERE)
    work = Path(tempfile.mkdtemp(prefix="stockade-mutants-"))
    missed, broken, root_only = [], [], []
    try:
        if not args.no_control:
            control = work / "control"
            copy_tree(names, HERE, control)
            if not imports_itself(control):
                raise SystemExit("the copy imports the checkout's package, not its own")
            # (the programs a C mutant's catch is measured against: built the same way)
            failed = build_programs(control) if build else ""
            if failed:
                print(f"control: {failed}")
                return 2
            tests = tuple(dict.fromkeys(t for m in ours for t in m.tests))
            status, took, said = run_tests(control, tests)
            print(f"control (unmutated, {len(tests)} test ids"
                  + (", programs rebuilt" if build else "")
                  + f"): status {status}, {took:.0f} s", flush=True)
            if status != 0:
                print(said)
                return 2
            shutil.rmtree(control)
        total = time.monotonic()
        for mutant in ours:
            tree = work / mutant.name
            copy_tree(names, HERE, tree)
            mutate(tree, mutant)
            failed = build_programs(tree) if rebuilt(mutant) else ""
            if failed:
                broken.append(mutant.name)
                print(f"BROKEN            {mutant.name}  ({failed})", flush=True)
                if not args.keep:
                    shutil.rmtree(tree)
                continue
            status, took, said = run_tests(tree, mutant.tests)
            caught = status == 1  # (a test failed; 2-5 are pytest's own errors, not a catch)
            if status == 5 and os.getuid() != 0:  # (every test of it is root-only: none ran)
                root_only.append(mutant.name)
                print(f"not run   {took:6.1f} s  {mutant.name}  (its tests need root)",
                      flush=True)
            else:
                if not caught:
                    missed.append(mutant.name)
                print(f"{'caught' if caught else 'MISSED'} {took:6.1f} s  {mutant.name}"
                      + (f"  by {said}" if caught else f"  (pytest status {status})\n{said}"),
                      flush=True)
            if not args.keep:
                shutil.rmtree(tree)
        for mutant in chosen:
            if mutant.owner:
                print(f"not run         {mutant.name}  ({mutant.owner})")
            elif mutant.name in unrunnable:
                print(f"not run         {mutant.name}  (its tests show it only to a user who "
                      "is not root: run it as one)")
            elif mutant.name in elsewhere:
                print(f"not run         {mutant.name}  (its tests are the integrations': run "
                      "it with .venv-integrations/bin/python)")
        run = len(ours) - len(root_only)
        print(f"{run - len(missed) - len(broken)} of {run} caught in "
              f"{time.monotonic() - total:.0f} s"
              + (f"; {len(root_only)} not run here, their tests root-only: "
                 f"{' '.join(root_only)}" if root_only else "")
              + (f"; {len(unrunnable)} not run as root, their tests rootless-only: "
                 f"{' '.join(unrunnable)}" if unrunnable else "")
              + (f"; missed: {' '.join(missed)}" if missed else "")
              + (f"; broken (the build failed): {' '.join(broken)}" if broken else ""))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"copies kept in {work}")
    return 1 if missed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
