"""Launch benchmarks: Stockade against its peers, measured in one run, interleaved, with warm-up.

    python bench/run.py [--rounds N] [--markdown]

Contenders that are not installed are reported as missing, never silently dropped. Run it with
the project's own interpreter (e.g. `.venv/bin/python bench/run.py`), not through a shim.
"""

from __future__ import annotations

import argparse
import atexit
import compileall
import contextlib
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import stockade  # noqa: E402
from stockade.cliwire import IDLE_ENV  # noqa: E402
from stockade.policy import preset  # noqa: E402

ROOTS = ("/usr", "/etc")
NAMESPACES_ALONE = "namespaces alone"
PAIRS = 400  # warm session against bare subprocess, in pairs of their own
LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"), ("usr/lib64", "/lib64"))


def bwrap_argv(workspace: str, *command: str) -> list[str]:
    """bwrap with the closest equivalent of Stockade's read-only preset."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    for root in ROOTS:
        argv += ["--ro-bind", root, root]
    for target, link in LINKS:
        if os.path.islink(link):
            argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    return argv + ["--ro-bind", workspace, workspace, "--chdir", workspace, *command]


def contenders(workspace: str) -> dict[str, Callable[[], object] | str]:
    """name -> a zero-argument launch of `true`, or the reason it is missing."""
    policy = preset("read-only")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    cli_env = {**os.environ, "PYTHONPATH": REPO, "PYTHONPYCACHEPREFIX": _bytecode()}
    cli_env.pop("PYTHONDONTWRITEBYTECODE", None)
    served_env = {**cli_env, "STOCKADE_STATE_DIR": _cli_server(cli_env)}
    started_env = {**cli_env, "STOCKADE_STATE_DIR": _started_server_state(), IDLE_ENV: "600"}
    cli_env["STOCKADE_NO_SERVER"] = "1"
    # The `stockade` command as installed: bin/stockade, the same plain script.
    cli = [sys.executable, os.path.join(REPO, "bin", "stockade"), "run", "--preset",
           "read-only", "--workspace", workspace, "--", "true"]
    found: dict[str, Callable[[], object] | str] = {
        "bare subprocess": lambda: subprocess.run(["true"], check=True),
        "python -c pass": lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
        "stockade API": lambda: _check(stockade.run(["true"], policy, workspace=workspace)),
        # As a user has it: the first run (a warm-up round) starts the CLI server the next
        # ones use (stockade/cli/autoserver.py).
        "stockade CLI": lambda: subprocess.run(cli, check=True, env=started_env, **quiet),
        "stockade CLI, no server": lambda: subprocess.run(cli, check=True, env=cli_env,
                                                          **quiet),
        "stockade CLI, daemon running": lambda: subprocess.run(cli, check=True, env=served_env,
                                                               **quiet),
    }
    # The landlock tier (isolation = "landlock"; as root the preset's limits.pids is lifted,
    # said on stderr).
    tier = replace(policy, isolation="landlock")
    found["stockade API, isolation landlock"] = lambda: _check(
        stockade.run(["true"], tier, workspace=workspace))
    found["stockade CLI, isolation landlock"] = (
        lambda: subprocess.run([*cli[:-2], "--isolation", "landlock", "--", "true"],
                               check=True, env=cli_env, **quiet))
    session = stockade.Sandbox(preset="read-only", workspace=workspace)
    session.__enter__()
    atexit.register(session.close)
    found["stockade warm session"] = lambda: _check(session.run(["true"]))
    peers = {
        "bwrap": bwrap_argv(workspace, "true"),
        "firejail": ["firejail", "--quiet", "--noprofile", "--net=none", "--private-tmp", "true"],
        "unshare": ["unshare", "-Urmpf", "--mount-proc", "true"],
    }
    for name, argv in peers.items():
        if shutil.which(argv[0]) is None:
            found[name] = f"missing: {argv[0]} is not installed"
        elif subprocess.run(argv, **quiet).returncode != 0:
            found[name] = f"missing: {argv[0]} does not run here"
        else:
            found[name] = (lambda a=argv: subprocess.run(a, check=True, **quiet))
    return found


def _bytecode() -> str:
    """A private bytecode cache of the package, compiled now: an installed package has its
    bytecode, so the CLI's figure must not include compiling it (PYTHONDONTWRITEBYTECODE would
    otherwise make every run compile every module)."""
    prefix = tempfile.mkdtemp(prefix="stockade-bench-pyc-")
    atexit.register(shutil.rmtree, prefix, True)
    previous, sys.pycache_prefix = sys.pycache_prefix, prefix
    try:
        compileall.compile_dir(os.path.join(REPO, "stockade"), quiet=1)
    finally:
        sys.pycache_prefix = previous
    return prefix


def _cli_server(env: dict[str, str]) -> str:
    """A state directory where `stockade daemon` serves `stockade run` (stockade/cli/server.py),
    once its CLI server answers; the daemon ends with the benchmark."""
    state = tempfile.mkdtemp(prefix="stockade-bench-state-")
    daemon = subprocess.Popen([sys.executable, "-m", "stockade", "daemon", "--socket",
                               os.path.join(state, "daemon.sock")],
                              env={**env, "STOCKADE_STATE_DIR": state},
                              stderr=subprocess.DEVNULL)
    atexit.register(shutil.rmtree, state, True)
    atexit.register(daemon.wait)
    atexit.register(daemon.terminate)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and daemon.poll() is None:
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(os.path.join(state, "cli.sock")) == 0:
                return state
        time.sleep(0.1)
    raise RuntimeError("stockade daemon did not start its CLI server")


def _started_server_state() -> str:
    """A state directory where the first `stockade run` starts a CLI server; it is ended with
    the benchmark (found by what listens on its socket, as the kernel says)."""
    state = tempfile.mkdtemp(prefix="stockade-bench-started-")
    atexit.register(shutil.rmtree, state, True)
    atexit.register(_end_started_server, os.path.join(state, "cli.sock"))
    return state


def _end_started_server(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as probe:
        if probe.connect_ex(path) != 0:
            return
        pid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                   12))[0]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)  # (its own group: it and its spare)


def _check(result: stockade.Result) -> None:
    if result.exit_code != 0:
        raise RuntimeError(f"stockade run failed: {result}")


def latency(runners: dict[str, Callable[[], object]], rounds: int,
            warmup: int) -> dict[str, list[float]]:
    """Seconds per launch; each round runs every contender once, in a shuffled order."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for round_no in range(warmup + rounds):
        random.shuffle(names)
        for name in names:
            started = time.perf_counter()
            runners[name]()
            if round_no >= warmup:
                samples[name].append(time.perf_counter() - started)
    return samples


def paired(first: Callable[[], object], second: Callable[[], object], pairs: int
           ) -> tuple[float, float]:
    """Median seconds of each of two contenders run in `pairs` pairs of their own, each pair
    in a random order: nothing else runs meanwhile, such as a zygote readying its next spare
    after a cold API launch of the shuffled rounds."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(pairs):
        order = [0, 1]
        random.shuffle(order)
        for which in order:
            started = time.perf_counter()
            (first, second)[which]()
            times[which].append(time.perf_counter() - started)
    return statistics.median(times[0]), statistics.median(times[1])


def throughput(launch: Callable[[], object], callers: int, seconds: float
               ) -> tuple[float, float]:
    """Launches per second with `callers` threads launching back to back, and milliseconds of
    CPU time per launch, of the whole machine (every process, kernel threads included)."""
    deadline = time.perf_counter() + seconds

    def loop() -> int:
        count = 0
        while time.perf_counter() < deadline:
            launch()
            count += 1
        return count

    started, busy = time.perf_counter(), _busy_seconds()
    with ThreadPoolExecutor(callers) as pool:
        total = sum(pool.map(lambda _: loop(), range(callers)))
    return total / (time.perf_counter() - started), (_busy_seconds() - busy) / total * 1000


def _busy_seconds() -> float:
    """CPU seconds the machine has spent not idle since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # (idle, iowait)


def namespaces_alone() -> None:
    """The floor of any sandbox made from Python: one clone(2) into the same fresh namespaces
    as Stockade's (stockade.linux.ns), whose child execs `true` at once: no view, no
    confinement, no init. The rest of a Stockade launch's cost is above this."""
    from stockade.linux import ns

    pid, pidfd = ns.clone_sandbox(network=True)
    if pid == 0:
        try:
            os.execv("/bin/true", ["true"])
        finally:
            os._exit(127)
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    finally:
        os.close(pidfd)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _ppid(int(entry))) is not None:
            children.setdefault(ppid, []).append(int(entry))
    return children


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _tree_memory(roots: list[int]) -> tuple[int, int]:
    """Summed (RSS, PSS) in bytes of `roots` and all their descendants. PSS charges each shared
    page to its sharers in proportion, so it is what a sandbox adds; RSS counts shared pages
    (e.g. the interpreter a forked process shares with its zygote) in full."""
    children = _children()
    rss = pss = 0
    todo = list(roots)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        rss += int(fields["Rss"].split()[0]) * 1024
        pss += int(fields["Pss"].split()[0]) * 1024
    return rss, pss


def memory_per_sandbox(workspace: str, count: int = 8) -> dict[str, tuple[float, float]]:
    """(RSS, PSS) in MiB of the processes that keep one idle sandbox (`sleep`) alive, per
    sandbox."""
    from stockade.linux.zygote import ZYGOTE

    out: dict[str, float] = {}
    sleeper = ["sleep", "30"]
    with ThreadPoolExecutor(count) as pool:
        cancels = []
        futures = []
        for _ in range(count):
            cancel = threading.Event()
            cancels.append(cancel)
            futures.append(pool.submit(stockade.run, sleeper, preset("read-only"),
                                       workspace=workspace, cancel=cancel))
        time.sleep(2.0)
        zygote = ZYGOTE._proc.pid if ZYGOTE._proc else None
        children = _children()
        descendants: list[int] = []
        stack = [zygote] if zygote is not None else []
        while stack:
            kids = children.get(stack.pop(), [])
            descendants += kids
            stack += kids
        inits = [  # sandboxes' pid 1 (children of the zygote, or of a view's template) whose
            # command is the sleeper; the spares and the template are not counted
            init for init in descendants
            if any(_comm(pid) == "sleep" for pid in children.get(init, []))]
        assert len(inits) == count, f"{len(inits)} sleeping sandboxes found, not {count}"
        rss, pss = _tree_memory(inits)
        out["stockade"] = (rss / count / 2**20, pss / count / 2**20)
        for cancel in cancels:
            cancel.set()
        for future in futures:
            future.result()
    if shutil.which("bwrap"):
        procs = [subprocess.Popen(bwrap_argv(workspace, *sleeper)) for _ in range(count)]
        time.sleep(1.0)
        rss, pss = _tree_memory([p.pid for p in procs])
        out["bwrap"] = (rss / count / 2**20, pss / count / 2**20)
        for p in procs:
            p.kill()
            p.wait()
    return out


PEER_CHECKS = 400
PEER_CLIENT = """
import socket, sys
for _ in range(int(sys.argv[2])):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sys.argv[1])
        s.recv(1)
"""


def peer_check_cost(checks: int = PEER_CHECKS) -> float:
    """Median ms of the check Stockade's servers make of each connection (stockade/linux/
    peer.py: the peer's pidfd and its own /proc, against the server's context), on real
    connections from another process, as the CLI server makes it for `stockade run`."""
    from stockade.linux import peer

    directory = tempfile.mkdtemp(prefix="stockade-bench-peer-")
    path = os.path.join(directory, "peer.sock")
    own = peer.own_context(peer.RUN_CONTEXT)
    samples = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(8)
        client = subprocess.Popen([sys.executable, "-c", PEER_CLIENT, path, str(checks)])
        try:
            for _ in range(checks):
                conn, _ = listener.accept()
                with conn:
                    started = time.perf_counter()
                    peer.check_peer(conn, own, accepted=peer.boottime())
                    samples.append(time.perf_counter() - started)
                    conn.sendall(b"x")
        finally:
            client.wait(60)
            shutil.rmtree(directory, ignore_errors=True)
    return statistics.median(samples) * 1000


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def machine() -> str:
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), platform.machine())
    return (f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({model}), "
            f"Python {platform.python_version()}, uid {os.getuid()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput figure")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    workspace = tempfile.mkdtemp(prefix="stockade-bench-")
    try:
        found = contenders(workspace)
        runners = {k: v for k, v in found.items() if callable(v)}
        samples = latency(runners, args.rounds, args.warmup)
        medians = {k: statistics.median(v) * 1000 for k, v in samples.items()}
        warm_pairs = None
        if "stockade warm session" in runners:
            warm_pairs = tuple(1000 * t for t in paired(runners["stockade warm session"],
                                                        runners["bare subprocess"], PAIRS))
        rates = {}
        loops = {**runners, NAMESPACES_ALONE: namespaces_alone}
        for name in ("stockade API", "bwrap", NAMESPACES_ALONE):
            if name in loops:
                for callers in (1, 2):
                    rates[(name, callers)] = throughput(loops[name], callers, args.seconds)
        memory = memory_per_sandbox(workspace)
        peer_ms = peer_check_cost()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    print(render(found, medians, rates, memory, args.markdown, warm_pairs, peer_ms))
    return 0


def render(found: dict, medians: dict[str, float], rates: dict,
           memory: dict[str, tuple[float, float]], markdown: bool,
           warm_pairs: tuple[float, float] | None = None,
           peer_ms: float | None = None) -> str:
    bwrap = medians.get("bwrap")
    interp = medians.get("python -c pass")
    rows = [("contender", "median ms", "× bwrap")]
    for name, value in found.items():
        if name in medians:
            ratio = f"{medians[name] / bwrap:.2f}" if bwrap else "-"
            rows.append((name, f"{medians[name]:.2f}", ratio))
        else:
            rows.append((name, str(value), ""))
    lines = [f"Machine: {machine()}", "", *_table(rows, markdown), ""]
    if markdown:
        lines[:0] = ["# Performance", "",
                     "Generated by `python bench/run.py --markdown` (medians of interleaved "
                     "rounds after warm-up; every contender launches `true`).", ""]
    if interp and bwrap:
        budget = 1.5 * (interp + bwrap)
        for name in ("stockade CLI", "stockade CLI, no server", "stockade CLI, daemon running"):
            if name in medians:
                lines.append(f"{name}: {medians[name]:.2f} ms against a budget of 1.5 × "
                             f"(interpreter {interp:.2f} + bwrap {bwrap:.2f}) = {budget:.2f} ms "
                             f"({medians[name] / budget:.2f} × the budget); interpreter "
                             f"start-up is {interp / medians[name]:.0%} of it")
        lines.append("")
    if peer_ms is not None:
        lines += [f"Peer check (each connection to the CLI server or the daemon, in the server): "
                  f"{peer_ms:.3f} ms median of {PEER_CHECKS} real connections (budget 0.3 ms)",
                  ""]
    bare = medians.get("bare subprocess")
    if bare and warm_pairs and "stockade warm session" in medians:
        warm, paired_bare = warm_pairs
        shuffled = medians["stockade warm session"] / bare
        lines += [f"Warm session: {warm:.2f} ms, {warm / paired_bare:.2f} × a bare "
                  f"subprocess.run(['true']) from the same process ({paired_bare:.2f} ms), in "
                  f"{PAIRS} interleaved pairs of their own (target ≤ 2×); {shuffled:.2f} × in "
                  f"the shuffled rounds above", ""]
    if rates:
        rows = [("throughput", "1 caller /s", "2 callers /s", "CPU ms per launch")]
        for name in ("stockade API", "bwrap", NAMESPACES_ALONE):
            if (name, 1) in rates:
                (one, cpu), (two, _) = rates[(name, 1)], rates[(name, 2)]
                rows.append((name, f"{one:.0f}", f"{two:.0f}", f"{cpu:.2f}"))
        if ("bwrap", 2) in rates and ("stockade API", 2) in rates:
            rows.append(("stockade ÷ bwrap",
                         *(f"{rates[('stockade API', n)][0] / rates[('bwrap', n)][0]:.2f}"
                           for n in (1, 2)),
                         f"{rates[('stockade API', 1)][1] / rates[('bwrap', 1)][1]:.2f}"))
        lines += [*_table(rows, markdown), "",
                  f"CPU per launch is the whole machine's busy time over a 1-caller loop. "
                  f"\"{NAMESPACES_ALONE}\" is the floor of a sandbox made from Python: the same "
                  "fresh namespaces, whose child execs `true` at once (no view, no confinement, "
                  "no init).", ""]
    if memory:
        lines += _table([("memory per idle sandbox", "RSS MiB", "PSS MiB"),
                         *((k, f"{rss:.1f}", f"{pss:.1f}") for k, (rss, pss) in memory.items())],
                        markdown)
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
        return out + ["| " + " | ".join(row) + " |" for row in rows[1:]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


if __name__ == "__main__":
    sys.exit(main())
