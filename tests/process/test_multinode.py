"""Static multi-node without SLURM: two launchers on this machine (`--nnodes 2 --node-rank 0/1 --master-addr
127.0.0.1 --master-port P`) form one job. Node 0's launcher serves the store on the master address only; ranks are
node_rank * nproc + local; the nodes check in through the store before starting workers; bad node options exit 2
with nothing started; a failure on one node ends both launchers, the failing one with the root cause's code.

No GPUs here: each node runs CPU ranks (gloo). Workers that import torch are slow on 2 cores, so the training job
is short (examples/train.py --steps 20) and only one test runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import psutil

from tests.support import (
    ENVDUMP,
    REPO,
    clean_env,
    ddpboot_exe,
    finish,
    free_port,
    reports,
    run_launcher,
    start_launcher,
    wait_for,
)

TRAIN = [str(REPO / "examples" / "train.py"), "--steps", "20", "--log-every", "10"]


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
    assert c0 != 0, o0 + e0


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
