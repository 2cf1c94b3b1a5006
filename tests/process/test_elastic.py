"""Elastic jobs (`--nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint HOST:PORT`): two launchers on this machine
form rounds through torch's c10d rendezvous (launcher A, started first, hosts it on 127.0.0.1).

A late node makes the running group restart at the larger world size (a membership change, not counted against
--max-restarts); a worker failure restarts the group while restarts remain (TORCHELASTIC_RESTART_COUNT counts them)
and otherwise ends the launcher with the worker's exit code; a node that dies makes the others' workers fail and
restart without it; bad options exit 2 before anything starts; the rendezvous agent dies with its launcher.

Workers are tests/process/scripts/elastic_job.py on CPU (gloo). Tests wait for the files the workers write, never
for a fixed time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import SCRIPTS, clean_env, finish, free_port, gone, run_launcher, start_launcher, wait_for

JOB = str(SCRIPTS / "elastic_job.py")
FAST_ROUNDS = "last_call_timeout=1"  # a round of fewer than MAX nodes forms 1 s after MIN have joined


def elastic_args(port: int, *extra: str, nnodes: str = "1:2", conf: str = FAST_ROUNDS) -> list[str]:
    return ["--nnodes", nnodes, "--nproc", "2", "--cpu", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-conf", conf, *extra]


def job_env(out: Path, **extra: str) -> dict[str, str]:
    return clean_env(ELASTIC_OUT=str(out), OMP_NUM_THREADS="1", **extra)


def files(out: Path, pattern: str) -> dict[int, dict[str, Any]]:
    return {int(p.stem.rsplit("rank", 1)[1]): json.loads(p.read_text()) for p in out.glob(pattern)}


def running(out: Path, pattern: str, count: int, *launchers: subprocess.Popen[Any]) -> dict[int, dict[str, Any]]:
    """The `count` workers' files matching `pattern`, once they are all there; fails early if a launcher exits."""

    def ready() -> dict[int, dict[str, Any]] | None:
        for proc in launchers:
            if proc.poll() is not None:
                _, o, e = finish(proc)
                raise AssertionError(f"a launcher exited ({proc.returncode}) before {pattern}:\n{o}\n{e}")
        found = files(out, pattern)
        return found if len(found) == count else None

    result: dict[int, dict[str, Any]] = wait_for(ready, 60, f"{count} workers writing {pattern}", interval=0.05)
    return result


def stop_all(*procs: subprocess.Popen[Any]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.timeout(90)
def test_a_late_node_restarts_the_group_at_the_larger_world_size(tmp_path: Path) -> None:
    port = free_port()
    env = job_env(tmp_path)
    # --max-restarts 0 on A: the membership change must not need (or use up) a restart.
    a = start_launcher(elastic_args(port, "--max-restarts", "0", JOB), env)
    b = None
    try:
        alone = running(tmp_path, "running-r0-w2-rank*.json", 2, a)
        b = start_launcher(elastic_args(port, JOB), env)
        (ca, oa, ea), (cb, ob, eb) = finish(a, 90), finish(b, 90)
    finally:
        stop_all(a, *([b] if b else []))
    assert ca == 0, oa + ea
    assert cb == 0, ob + eb
    assert {r: d["env"]["WORLD_SIZE"] for r, d in alone.items()} == {0: "2", 1: "2"}
    assert "1 node waiting to join the rendezvous" in ea and "stopping every rank of this node to restart" in ea, ea
    final = files(tmp_path, "final-rank*.json")
    assert sorted(final) == [0, 1, 2, 3], (ea, eb)
    for rank, data in final.items():
        e = data["env"]
        assert (data["rank"], data["world"], data["all_reduce"]) == (rank, 4, 10.0)  # 1+2+3+4
        assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) == (str(rank), "4", "2", "2")
        assert e["DDPBOOT_LOCAL_RANK"] == str(rank % 2)
        assert e["GROUP_RANK"] == str(rank // 2)
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"  # a membership change is not a restart
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert len({d["env"][key] for d in final.values()}) == 1, key
    # The launchers took different group ranks, and each one's ranks follow from its group rank.
    said = [re.search(r"node (\d) of 2 \[.*\], ranks (\d)-(\d) of world size 4", text) for text in (ea, eb)]
    assert all(said), (ea, eb)
    groups = [tuple(int(x) for x in m.groups()) for m in said if m]
    assert sorted(g for g, _, _ in groups) == [0, 1]
    assert all((first, last) == (2 * g, 2 * g + 1) for g, first, last in groups), groups


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fast", [False, True], ids=["exec", "fast-start"])
def test_a_failed_worker_restarts_the_group_through_a_new_round(fast: bool, tmp_path: Path) -> None:
    env = job_env(tmp_path, ELASTIC_TARGET_WORLD="2", ELASTIC_FAIL="0:1")  # rank 1 exits 7 in attempt 0
    flags = ["--fast-start"] if fast else []
    proc = run_launcher(elastic_args(free_port(), "--max-restarts", "1", *flags, JOB), env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "rank 1 failed on attempt 0 (1 restart left): exit code 7" in proc.stderr
    assert "restart 1 of 1 (TORCHELASTIC_RESTART_COUNT=1)" in proc.stderr
    final = files(tmp_path, "final-rank*.json")
    assert sorted(final) == [0, 1]
    for data in final.values():
        assert (data["env"]["TORCHELASTIC_RESTART_COUNT"], data["env"]["TORCHELASTIC_MAX_RESTARTS"]) == ("1", "1")
        assert data["all_reduce"] == 3.0
        assert ("__ddpboot_zygote__" in data["parent"]) == fast  # each round forks from the one zygote
    assert not list(tmp_path.glob("running-r0-*"))  # attempt 0 never got past rank 1's crash


@pytest.mark.timeout(60)
def test_without_restarts_the_failing_workers_code_is_the_exit_code(tmp_path: Path) -> None:
    env = job_env(tmp_path, ELASTIC_TARGET_WORLD="2", ELASTIC_FAIL="0:1")
    proc = run_launcher(elastic_args(free_port(), JOB), env, timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert "rank 1 failed: exit code 7" in proc.stderr
    assert "re-joining" not in proc.stderr
    assert files(tmp_path, "final-rank*.json") == {}


@pytest.mark.timeout(90)
def test_a_lost_node_makes_the_others_restart_without_it(tmp_path: Path) -> None:
    """B's launcher is killed (-9) while both nodes run a world of 4: B's workers die with it, A's fail in their
    all_reduce, and A (one restart allowed) forms a round alone once B's heartbeats have expired (2 s x 4)."""
    port = free_port()
    conf = f"{FAST_ROUNDS},keep_alive_interval=2,keep_alive_max_attempt=4"
    # Attempt 0 waits to be stopped in a world of 4; attempt 1 finishes alone in a world of 2.
    env = job_env(tmp_path, ELASTIC_TARGET_WORLD="4,2", ELASTIC_STEPS="1000000,5")
    a = start_launcher(elastic_args(port, "--max-restarts", "1", JOB, conf=conf), env)
    b = None
    try:
        running(tmp_path, "running-r0-w2-rank*.json", 2, a)
        b = start_launcher(elastic_args(port, JOB, conf=conf), env)
        running(tmp_path, "running-r0-w4-rank*.json", 4, a, b)
        os.kill(b.pid, signal.SIGKILL)
        code, out, err = finish(a, 80)
    finally:
        stop_all(a, *([b] if b else []))
    assert code == 0, out + err
    assert "restart 1 of 1 (TORCHELASTIC_RESTART_COUNT=1)" in err, err
    final = files(tmp_path, "final-rank*.json")
    assert sorted(final) == [0, 1], err
    for data in final.values():
        assert (data["world"], data["env"]["GROUP_WORLD_SIZE"], data["env"]["TORCHELASTIC_RESTART_COUNT"]) == (
            2, "1", "1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "3:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400"],
         "--nnodes 3:2: MIN (3) is above MAX (2)"),
        (["--nnodes", "0:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400"],
         "at least 1 node"),
        (["--nnodes", "one:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400"],
         "is not a number of nodes"),
        (["--nnodes", "1:2", "--rdzv-backend", "c10d"], "Here --rdzv-endpoint is missing."),
        (["--nnodes", "1:2", "--rdzv-backend", "static", "--rdzv-endpoint", "127.0.0.1:29400"],
         "Here --rdzv-backend is static."),
        (["--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400"], "pass --rdzv-backend c10d"),
        (["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "--local-addr",
          "192.0.2.1"], "--local-addr 192.0.2.1 is not an address of this machine"),
    ],
    ids=["min-above-max", "min-zero", "not-a-number", "no-endpoint", "static-backend", "default-backend",
         "foreign-local-addr"],
)
@pytest.mark.timeout(60)
def test_bad_elastic_options_exit_2_and_start_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher([*args, "--nproc", "2", "--cpu", JOB], job_env(out), timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert "joining the rendezvous" not in proc.stderr and list(out.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_dry_run_shows_the_plan_and_says_ranks_come_from_the_rendezvous(tmp_path: Path) -> None:
    proc = run_launcher(["--dry-run", *elastic_args(free_port(), JOB)], job_env(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "elastic: 1 to 2 nodes through the c10d rendezvous" in text
    assert "are decided at each round" in text
    assert "rank 1 (local rank 1): " in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_the_rendezvous_agent_dies_with_its_launcher(tmp_path: Path) -> None:
    """kill -9 of a launcher waiting for a second node: its rendezvous agent (which imported torch) goes too."""
    launcher = start_launcher(elastic_args(free_port(), JOB, nnodes="2:3"), job_env(tmp_path))
    try:
        def agent() -> int | None:
            for child in psutil.Process(launcher.pid).children():
                if "ddpboot.launch.elastic.agent" in " ".join(child.cmdline()):
                    return child.pid
            return None

        pid = wait_for(agent, 30, "the rendezvous agent to start")
        os.kill(launcher.pid, signal.SIGKILL)
        wait_for(lambda: gone(pid), 10, f"the agent (pid {pid}) to die with its launcher")
    finally:
        stop_all(launcher)
