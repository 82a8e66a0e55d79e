"""`stockade.integrations.ray` on a real local Ray cluster of two nodes on this machine (a head
and a second node, both on loopback: Ray's own `cluster_utils.Cluster`), every command in a
real Stockade sandbox in a Ray actor: spread over both nodes, back-pressure, a per-task timeout
and cancellation that kill the command's tree, denials as data, and a node killed mid-run
(its tasks fail typed, nothing they started is left, the pool recovers on the other node)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import gone, marked

pytestmark = pytest.mark.usefixtures("linux")

# Ray takes the machine's address for its nodes unless told it is not clustering (read when
# it is imported): so every Ray process of the test uses loopback, and nothing listens beyond
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from stockade.integrations.ray import PoolError, SandboxPool  # noqa: E402
from stockade.integrations.workspace import FileError  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # a directory of its own (Ray's default, /tmp/ray, is one user's: root and rootless runs
    # go on at once), short (Ray's unix sockets live below it); RAY_TMPDIR for what Ray
    # writes besides the nodes' (the current cluster's address file)
    temp = tempfile.mkdtemp(prefix="ray-")
    os.environ["RAY_TMPDIR"] = temp
    os.mkdir(os.path.join(temp, "ray"))  # (where that file goes: RAY_TMPDIR/ray)
    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "temp_dir": temp})
    made.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    made.wait_for_nodes()
    ray.init(address=made.address, logging_level="ERROR", log_to_driver=False)
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    yield made
    ray.shutdown()
    made.shutdown()
    del os.environ["RAY_TMPDIR"]
    shutil.rmtree(temp, ignore_errors=True)


def test_a_pool_spreads_over_both_nodes_with_denials_as_data(cluster, ws):
    root, _ = ws
    with SandboxPool(2, preset="workspace-write", workspace=root,
                     actor_options={"num_cpus": 1}) as pool:  # (one a node: both used)
        assert len({node for node, _ in pool.ready()}) == 2
        outcomes = list(pool.map([f"echo {n} > out{n}; cat out{n}; touch /etc/x"
                                  for n in range(6)], shell=True))
        assert [o.stdout for o in outcomes] == [f"{n}\n" for n in range(6)]
        assert all(o.exit_code == 1 and "Read-only file system" in o.stderr for o in outcomes)
        assert sorted(os.listdir(root)) == [f"out{n}" for n in range(6)]
        slow = pool.submit(["sleep", "30"], timeout=1).result()
        assert slow.timed_out and slow.exit_code == 124
        assert [d.kind for d in slow.denials] == ["limits.timeout"]
        pool.write_file("note.txt", "hi\n").result()
        assert pool.read_file("note.txt").result() == b"hi\n"
        with pytest.raises(FileError) as refused:
            pool.read_file("/etc/passwd").result()
        assert refused.value.code == "outside_workspace"


def test_back_pressure_and_cancellation_kill_the_tree(cluster, ws):
    root, _ = ws
    marker = f"stockade-ray-cancel-{os.getpid()}"
    with SandboxPool(1, preset="workspace-write", workspace=root, max_pending=1) as pool:
        pool.ready()
        running = pool.submit(["python3", "-c", "import time; time.sleep(60)", marker])
        deadline = time.monotonic() + 30
        while not marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked(marker)
        waiting: list = []
        second = threading.Thread(target=lambda: waiting.append(pool.submit(["echo", "next"])))
        second.start()
        second.join(timeout=2)
        assert second.is_alive() and not waiting  # (the actor is busy: submit waits)
        started = time.monotonic()
        running.cancel()
        with pytest.raises(PoolError) as cancelled:
            running.result(timeout=30)
        assert cancelled.value.code == "cancelled"
        assert gone(marker, within=5) and time.monotonic() - started < 10
        second.join(timeout=30)
        assert waiting[0].result(timeout=60).stdout == "next\n"


def test_a_node_killed_mid_run_fails_its_tasks_typed_and_the_pool_recovers(cluster, ws):
    root, _ = ws
    doomed = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    deadline = time.monotonic() + 60
    while ray.cluster_resources().get("CPU") != 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # (until its resources reach the scheduler: placed there then)
    marker = f"stockade-ray-node-{os.getpid()}"
    placed = NodeAffinitySchedulingStrategy(node_id=doomed.node_id, soft=True)
    pool = None
    for _ in range(10):  # (soft affinity: Ray may place an actor elsewhere; then again)
        pool = SandboxPool(2, preset="workspace-write", workspace=root,
                           actor_options={"scheduling_strategy": placed})
        nodes = [node for node, _ in pool.ready()]
        if doomed.node_id in nodes:
            break
        pool.close()
        time.sleep(1)
    assert doomed.node_id in nodes
    with pool:
        tasks = [pool.submit(["python3", "-c", "import time; time.sleep(120)", marker])
                 for _ in range(2)]
        deadline = time.monotonic() + 30
        while len(marked(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(marked(marker)) == 2
        cluster.remove_node(doomed, allow_graceful=False)
        for task in tasks:
            if nodes[task.actor] != doomed.node_id:
                task.cancel()  # (its node lives on: this one is only cancelled)
            with pytest.raises(PoolError) as lost:
                task.result(timeout=60)
            assert lost.value.code == ("task_lost" if nodes[task.actor] == doomed.node_id
                                       else "cancelled")
        assert gone(marker, within=10)  # (the sandboxes died with their actors' processes)
        places = pool.ready(timeout=120)  # restarted on the surviving nodes
        assert doomed.node_id not in {node for node, _ in places}
        again = list(pool.map([["echo", "again"]] * 4))
        assert [o.stdout for o in again] == ["again\n"] * 4
