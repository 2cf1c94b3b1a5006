"""Static multi-node without SLURM: two launchers on this machine (`--nnodes 2 --node-rank 0/1 --master-addr
127.0.0.1 --master-port P`) form one job. Node 0's launcher serves the store on the master address only; ranks are
node_rank * nproc + local; the nodes check in through the store before starting workers; bad node options exit 2
with nothing started; a failure on one node ends both launchers, the failing one with the root cause's code.

No GPUs here: each node runs CPU ranks (gloo). Workers that import torch are slow on 2 cores, so the training job
is short (examples/train.py --steps 20) and only one test runs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import (
    ENVDUMP,
    REPO,
    SCRIPTS,
    clean_env,
    ddpboot_exe,
    finish,
    free_port,
    gone,
    reports,
    run_launcher,
    start_launcher,
    wait_for,
)

TRAIN = [str(REPO / "examples" / "train.py"), "--steps", "20", "--log-every", "10"]
NODES_JOB = str(SCRIPTS / "nodes_job.py")


def node_args(rank: int, port: int, nproc: int = 2, nnodes: int = 2) -> list[str]:
    return ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port",
            str(port), "--nproc", str(nproc)]


def run_nodes(per_node: list[list[str]], env: dict[str, str], timeout: float = 180) -> list[tuple[int, str, str]]:
    procs = [start_launcher(args, env) for args in per_node]
    return [finish(p, timeout) for p in procs]


def test_two_launchers_give_the_torchrun_environment(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(LAUNCH_TEST_OUT=str(tmp_path))
    results = run_nodes([[*node_args(r, port), ENVDUMP] for r in (0, 1)], env)
    for code, out, err in results:
        assert code == 0, out + err
    envs = {r: d["env"] for r, d in reports(tmp_path).items()}
    assert sorted(envs) == [0, 1, 2, 3]
    for rank, e in envs.items():
        assert e["RANK"] == str(rank)
        assert e["WORLD_SIZE"] == "4"
        assert e["LOCAL_WORLD_SIZE"] == "2"
        assert e["DDPBOOT_LOCAL_RANK"] == str(rank % 2)
        assert e["GROUP_RANK"] == str(rank // 2)
        assert e["GROUP_WORLD_SIZE"] == "2"
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    assert len({e["TORCHELASTIC_RUN_ID"] for e in envs.values()}) == 1  # --rdzv-id default agrees across nodes


def test_two_launchers_train_and_agree(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(OMP_NUM_THREADS="1")
    results = run_nodes([[*node_args(r, port), *TRAIN] for r in (0, 1)], env, timeout=240)
    text = ""
    for code, out, err in results:
        assert code == 0, out + err
        text += out
    assert "world size 4 (ddpboot)" in text
    assert len(re.findall(r"final loss \S+", text)) == 1
    sums = dict(re.findall(r"rank (\d+) param checksum (\S+)", text))
    assert sorted(sums) == ["0", "1", "2", "3"]
    assert len(set(sums.values())) == 1, sums


def test_node0_serves_the_store_on_the_master_address_only(tmp_path: Path) -> None:
    """While node 0 waits for node 1, its store listens on 127.0.0.1:P, not on 0.0.0.0 or ::."""
    port = free_port()
    env = clean_env(LAUNCH_TEST_OUT=str(tmp_path))
    node0 = start_launcher([*node_args(0, port), "--rdzv-conf", "join_timeout=120", ENVDUMP], env)
    try:
        def listening() -> list[Any]:
            return [c for c in psutil.net_connections(kind="tcp")
                    if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]

        socks = wait_for(listening, 60, f"node 0's store to listen on port {port}")
        assert {s.laddr.ip for s in socks} == {"127.0.0.1"}
        node1 = start_launcher([*node_args(1, port), ENVDUMP], env)
        for code, out, err in (finish(node0), finish(node1)):
            assert code == 0, out + err
    finally:
        if node0.poll() is None:
            node0.kill()
            finish(node0)


def test_mismatched_rank_counts_stop_both_nodes_before_any_worker(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(LAUNCH_TEST_OUT=str(tmp_path))
    results = run_nodes([[*node_args(0, port, nproc=2), ENVDUMP], [*node_args(1, port, nproc=1), ENVDUMP]], env)
    for code, out, err in results:
        assert code == 2, out + err
        assert "node 0" in err and "node 1" in err and "different numbers of ranks" in err, err
    assert reports(tmp_path) == {}


def test_a_failing_worker_ends_both_launchers(tmp_path: Path) -> None:
    """Rank 3 (node 1) dies with code 7 after init (os._exit: a crash, no teardown); ranks 0..2 are in a barrier.
    Node 1's launcher exits 7; node 0's workers lose their peers (gloo: connection closed) and node 0's launcher
    exits too, non-zero.

    Not sys.exit(7): ddpboot.shutdown() then destroys the process group at exit, the sibling on the same node sees
    the connection close and exits 1 while rank 3 is still tearing torch down, and the launcher's SIGTERM to rank 3
    replaces its 7 with 143 (a root-cause race of the launcher, seen on one node too)."""
    fail = tmp_path / "fail.py"
    fail.write_text(
        "import os, sys\nimport ddpboot\nctx = ddpboot.init()\n"
        "if ctx.rank == 3:\n    sys.stdout.flush()\n    os._exit(7)\nddpboot.barrier()\n"
    )
    port = free_port()
    env = clean_env(OMP_NUM_THREADS="1")
    (c0, o0, e0), (c1, o1, e1) = run_nodes([[*node_args(r, port), str(fail)] for r in (0, 1)], env, timeout=240)
    assert c1 == 7, o1 + e1
    assert "rank 3 failed" in e1
    # node 0's ranks failed too (their peers went), but the job's root cause is node 1's rank 3: so says node 0
    assert c0 == 7, o0 + e0
    assert "the job failed on node 1" in e0 and "rank 3 exit code 7" in e0, e0


def nodes_env(out: Path, **extra: str) -> dict[str, str]:
    return clean_env(NODES_OUT=str(out), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", **extra)


def endpoint_args(rank: int, port: int, *backend: str) -> list[str]:
    """torchrun's line of Kubernetes Indexed Jobs and multi-node wrappers: no --master-addr."""
    return ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", *backend, "--cpu",
            "--nproc", "1", NODES_JOB]


@pytest.mark.parametrize("backend", [(), ("--rdzv-backend", "c10d")], ids=["static", "c10d"])
def test_the_rdzv_endpoint_line_runs_as_torchrun_does(backend: tuple[str, ...], tmp_path: Path) -> None:
    """Static: the endpoint is node 0's store (--master-addr/--master-port); c10d: torch's rendezvous numbers the
    nodes and --node-rank is not used, as torchrun does it (and says so)."""
    port = free_port()
    results = run_nodes([endpoint_args(r, port, *backend) for r in (0, 1)], nodes_env(tmp_path), timeout=180)
    for code, out, err in results:
        assert code == 0, out + err
    reps = reports(tmp_path)
    assert sorted(reps) == [0, 1] and {r["sum"] for r in reps.values()} == {2.0}
    assert sorted(r["node_rank"] for r in reps.values()) == [0, 1]
    if backend:
        assert all("--node-rank not used through the c10d rendezvous" in err for _, _, err in results)


def start_nodes(tmp_path: Path, fail: str | None = None, sleep: str = "60") -> tuple[list[subprocess.Popen[Any]], int]:
    """Two launchers of one CPU rank each, by hand on loopback; both ranks past their all-reduce."""
    port = free_port()
    env = nodes_env(tmp_path, NODES_SLEEP=sleep, **({"NODES_FAIL_RANK": fail} if fail else {}))
    procs = [start_launcher([*node_args(r, port, nproc=1), NODES_JOB], env) for r in (0, 1)]
    return procs, port


def rank_pid(tmp_path: Path, rank: int, procs: list[subprocess.Popen[Any]]) -> int:
    def written() -> int | None:
        for p in procs:
            if p.poll() is not None and not (tmp_path / "failed").exists():
                _, o, e = finish(p)
                raise AssertionError(f"a launcher exited early ({p.returncode}):\n{o}\n{e}")
        path = tmp_path / f"rank{rank}.json"
        return json.loads(path.read_text())["pid"] if path.exists() else None

    pid: int = wait_for(written, 120, f"rank {rank} to report", interval=0.05)
    return pid


def test_a_failing_rank_on_one_node_ends_every_node(tmp_path: Path) -> None:
    """Node 1's rank exits 3 while node 0's rank sleeps (60 s): node 0 learns it from node 1's node link, stops
    its rank and exits 3 too, naming node 1's rank, well before the sleep ends (the issue's bound: 10 s)."""
    procs, _ = start_nodes(tmp_path, fail="1")
    try:
        rank0 = rank_pid(tmp_path, 0, procs)
        wait_for(lambda: (tmp_path / "failed").exists(), 120, "rank 1 to fail")
        failed_at = float((tmp_path / "failed").read_text())
        wait_for(lambda: gone(rank0), 10, "node 0's rank to be stopped", interval=0.01)
        stopped = time.time() - failed_at
        (c0, _, e0), (c1, _, e1) = finish(procs[0], 10), finish(procs[1], 10)
        ended = time.time() - failed_at
    finally:
        stop(procs)
    assert (c0, c1) == (3, 3), e0 + e1
    assert "ddpboot: node 1 (" in e0 and "failed: rank 1 exit code 3; stopping this node's rank" in e0, e0
    assert "the job failed on node 1" in e0 and "last line of rank 1: rank 1 fails now" in e0, e0
    assert "rank 1 failed: exit code 3" in e1
    print(f"node 0's rank stopped {stopped:.2f} s after node 1's rank failed; both launchers ended by {ended:.2f} s")
    assert stopped < 10


def test_a_failing_rank_ends_the_other_node_through_c10d_too(tmp_path: Path) -> None:
    """The c10d line: rank 1's launcher gives up and its rendezvous closes (or its store goes, when it hosted it);
    the other launcher's round stops at its next look, instead of sleeping on (no new round: the job ended)."""
    port = free_port()
    env = nodes_env(tmp_path, NODES_SLEEP="60", NODES_FAIL_RANK="1")
    procs = [start_launcher(endpoint_args(r, port, "--rdzv-backend", "c10d"), env) for r in (0, 1)]
    try:
        results = [finish(p, 45) for p in procs]
    finally:
        stop(procs)
    codes = sorted(code for code, _, _ in results)
    assert codes == [1, 3], results
    other = next(err for code, _, err in results if code == 1)
    assert "stopping this node's ranks (exit code 1)" in other and "rendezvous" in other, other


def test_a_killed_launcher_ends_the_other_node(tmp_path: Path) -> None:
    """kill -9 of node 1's launcher: its node link says so, node 0 stops its rank and exits 1 naming it."""
    procs, _ = start_nodes(tmp_path)
    try:
        rank0 = rank_pid(tmp_path, 0, procs)
        rank1 = rank_pid(tmp_path, 1, procs)
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.time()
        wait_for(lambda: gone(rank0), 10, "node 0's rank to be stopped", interval=0.01)
        print(f"node 0's rank stopped {time.time() - killed:.2f} s after node 1's launcher was killed")
        c0, _, e0 = finish(procs[0], 10)
        wait_for(lambda: gone(rank1), 30, "node 1's guardian to end its rank")
    finally:
        stop(procs)
    assert c0 == 1, e0
    assert re.search(r"the job failed on node 1 \(.*\): its ddpboot launcher \(pid \d+\) died", e0), e0


def test_a_frozen_node_is_lost(tmp_path: Path) -> None:
    """Node 1 frozen (its launcher and its node link stopped, as a host that hangs or drops off the network): its
    beats stop, node 0's link counts it lost after keep_alive_interval × keep_alive_max_attempt (0.25 s × 6) and
    node 0 stops. Thawed, node 1 finds itself reported lost (or node 0's store gone) and stops too."""
    procs, _ = start_nodes(tmp_path)
    frozen: list[int] = []
    try:
        rank0 = rank_pid(tmp_path, 0, procs)
        rank_pid(tmp_path, 1, procs)
        launcher = psutil.Process(procs[1].pid)
        link = [c.pid for c in launcher.children() if "ddpboot.nodes.link" in " ".join(c.cmdline())]
        assert len(link) == 1, launcher.children()
        frozen = [procs[1].pid, *link]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        since = time.time()
        wait_for(lambda: gone(rank0), 15, "node 0's rank to be stopped", interval=0.01)
        print(f"node 0 stopped its rank {time.time() - since:.2f} s after node 1 froze")
        c0, _, e0 = finish(procs[0], 10)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen = []
        c1, _, e1 = finish(procs[1], 30)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        stop(procs)
    assert c0 == 1 and "the job failed on node 1" in e0 and "no beat from its launcher for" in e0, e0
    assert c1 == 1, e1


def test_signals_to_every_process_of_a_step_leave_the_node_links_alone(tmp_path: Path) -> None:
    """A scheduler that signals every process of a step (slurmstepd's `--signal=USR1@90`, the time limit's SIGTERM)
    reaches the node links too: they ignore what the launcher decides on, so the job goes on and succeeds (a link
    killed by SIGUSR1 used to end the job on both nodes)."""
    procs, _ = start_nodes(tmp_path, sleep="6")
    try:
        for rank in (0, 1):
            rank_pid(tmp_path, rank, procs)
        links = [c for p in procs for c in psutil.Process(p.pid).children()
                 if "ddpboot.nodes.link" in " ".join(c.cmdline())]
        assert len(links) == 2, [p.pid for p in procs]
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGINT):
            for link in links:
                os.kill(link.pid, sig)
        results = [finish(p, 120) for p in procs]
    finally:
        stop(procs)
    for code, out, err in results:
        assert code == 0 and "failed" not in err, out + err


def test_a_job_that_succeeds_on_every_node_exits_0_on_every_node(tmp_path: Path) -> None:
    """The node links say nothing when the job succeeds, whichever node ends first: node 0 keeps its store up
    until node 1 has ended (its rank sleeps 2 s more)."""
    port = free_port()
    procs = [start_launcher([*node_args(r, port, nproc=1), NODES_JOB], nodes_env(tmp_path, NODES_SLEEP=str(2 * r)))
             for r in (0, 1)]
    for code, out, err in (finish(p, 120) for p in procs):
        assert code == 0 and "failed" not in err, out + err


def stop(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            finish(p)


def test_bad_node_options_exit_2_and_start_nothing(tmp_path: Path) -> None:
    env = clean_env(LAUNCH_TEST_OUT=str(tmp_path))
    cases = [
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"], "--node-rank 2 is outside 0..1"),
        (["--nnodes", "2", "--node-rank", "1"], "needs --master-addr"),
        (["--nnodes", "2", "--node-rank", "1", "--master-addr", "no-such-host.invalid"], "does not resolve"),
        (["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.0.2.1", "--master-port", str(free_port())],
         "not an address of this machine"),
    ]
    for args, expected in cases:
        proc = run_launcher([*args, "--nproc", "1", ENVDUMP], env, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert reports(tmp_path) == {}


def test_plan_shows_the_node_source() -> None:
    env = clean_env(DDPBOOT_FAKE_GPUS="8")
    proc = subprocess.run(
        [*ddpboot_exe(), "plan", *node_args(1, 29400), "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert (plan["world_size"], plan["nnodes"], plan["node_rank"]) == (4, 2, 1)
    assert [r["rank"] for r in plan["ranks"]] == [2, 3]
    assert plan["cluster"]["source"] == "flags"
    assert plan["cluster"]["master_addr"] == "127.0.0.1"
