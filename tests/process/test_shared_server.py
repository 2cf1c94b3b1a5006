"""Shared-server hygiene with real launchers on a simulated 4-GPU machine: concurrent jobs get disjoint GPUs,
a waiting job starts when GPUs are released, a killed launcher's locks are free at once, and each worker's CPU
affinity and OMP_NUM_THREADS are the plan's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, clean_env, ddpboot_exe, run_ddpboot, wait_for

HOLD = str(REPO / "tests" / "process" / "scripts" / "hold_gpus.py")


def start(out: Path, tag: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*ddpboot_exe(), *args, HOLD, str(out), tag],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def got(out: Path, tag: str, n: int) -> list[str] | None:
    files = sorted(out.glob(f"{tag}.*.json"))
    if len(files) < n:
        return None
    return [json.loads(f.read_text())["uuids"] for f in files]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    locks = tmp_path / "locks"
    return clean_env(DDPBOOT_FAKE_GPUS="4", DDPBOOT_LOCK_DIR=str(locks))


def test_jobs_started_together_get_disjoint_gpus_every_time(tmp_path: Path, env: dict[str, str]) -> None:
    for attempt in range(8):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        jobs = [start(out, tag, "--nproc", "2", env=env) for tag in ("a", "b")]
        try:
            a = wait_for(lambda out=out: got(out, "a", 2), 30, "job a's workers")
            b = wait_for(lambda out=out: got(out, "b", 2), 30, "job b's workers")
            assert len(set(a) | set(b)) == 4, f"attempt {attempt}: jobs share GPUs: {a} {b}"
        finally:
            (out / "release").touch()
            for job in jobs:
                job.wait(timeout=60)
        assert [job.returncode for job in jobs] == [0, 0], [job.stderr.read() for job in jobs if job.stderr]


def test_a_waiting_job_starts_when_gpus_are_released(tmp_path: Path, env: dict[str, str]) -> None:
    a = start(tmp_path, "a", "--nproc", "2", env=env)
    b = start(tmp_path, "b", "--nproc", "2", env=env)
    c = None
    try:
        held_a = wait_for(lambda: got(tmp_path, "a", 2), 30, "job a")
        wait_for(lambda: got(tmp_path, "b", 2), 30, "job b")
        c = start(tmp_path, "c", "--nproc", "2", "--wait-for-gpus", "60", env=env)
        assert c.stderr is not None
        line = c.stderr.readline()  # the progress line comes before anything starts
        assert "waiting for GPUs" in line and "locked by" in line, line
        assert got(tmp_path, "c", 1) is None
        (tmp_path / "release.a").touch()
        assert a.wait(timeout=60) == 0
        held_c = wait_for(lambda: got(tmp_path, "c", 2), 30, "job c to start on job a's GPUs")
        assert sorted(held_c) == sorted(held_a)
    finally:
        (tmp_path / "release").touch()
        for job in (a, b, c):
            if job is not None:
                job.wait(timeout=60)


def test_a_killed_launchers_gpus_are_free_at_once(tmp_path: Path, env: dict[str, str]) -> None:
    a = start(tmp_path, "a", "--nproc", "4", env=env)
    try:
        wait_for(lambda: got(tmp_path, "a", 4), 30, "job a")
        busy = run_ddpboot("plan", "--nproc", "1", env=env)
        assert busy.returncode == 2 and "locked by" in busy.stderr
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=10)

        def free() -> bool:
            return run_ddpboot("plan", "--nproc", "4", "--json", env=env).returncode == 0

        wait_for(free, 10, "the killed job's GPUs to be free")
    finally:
        (tmp_path / "release").touch()


def test_explicit_locked_gpu_names_the_holder_unless_shared(tmp_path: Path, env: dict[str, str]) -> None:
    a = start(tmp_path, "a", "--gpus", "2", env=env)
    try:
        wait_for(lambda: got(tmp_path, "a", 1), 30, "job a")
        refused = run_ddpboot("--gpus", "2", HOLD, str(tmp_path), "b", env=env)
        assert refused.returncode == 2
        assert "GPU 2 is locked by another ddpboot job" in refused.stderr and f"pid {a.pid}" in refused.stderr
        (tmp_path / "release.b").touch()
        shared = run_ddpboot("--gpus", "2", "--share", HOLD, str(tmp_path), "b", env=env)
        assert shared.returncode == 0, shared.stderr
        gpus = json.loads(run_ddpboot("gpus", "--json", env=env).stdout)["gpus"]
        assert [g["locked"] for g in gpus] == [False, False, True, False]
        assert gpus[2]["locked_by"]["pid"] == a.pid
    finally:
        (tmp_path / "release").touch()
        a.wait(timeout=60)


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [([], {}), (["--cpu-affinity", "none"], {}), ([], {"OMP_NUM_THREADS": "3"}), (["--cpu-affinity", "0"], {})],
)
def test_workers_get_the_planned_cores_and_threads(
    tmp_path: Path, env: dict[str, str], args: list[str], extra_env: dict[str, str]
) -> None:
    env = {**env, **extra_env}
    plan = json.loads(run_ddpboot("plan", "--nproc", "2", *args, "--json", env=env).stdout)
    (tmp_path / "release").touch()
    out = run_ddpboot("--nproc", "2", *args, HOLD, str(tmp_path), "w", env=env)
    assert out.returncode == 0, out.stderr
    allowed = sorted(os.sched_getaffinity(0))
    for slot in plan["ranks"]:
        seen = json.loads((tmp_path / f"w.{slot['rank']}.json").read_text())
        assert seen["cpus"] == (slot["cpus"] or allowed)
        assert seen["omp"] == extra_env.get("OMP_NUM_THREADS", str(slot["omp_threads"]))
