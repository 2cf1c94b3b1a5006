"""Smoke test of the local SLURM test cluster (scripts/ci/slurm-up): eight emulated nodes n1 .. n8 on this machine;
the tests here use two of them, n1 and n2, named (-w) so that another job's nodes still completing cannot move
the allocation elsewhere.

Checks the facts the SLURM support rests on against a real slurmctld/slurmd: what `srun` gives each
task, that `sbatch --wait` returns the batch script's exit code, and that `scancel` ends a job's processes.
Skips when no cluster is up; start one with `sudo scripts/ci/slurm-up`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import CLUSTER_CONF, slurm, slurm_env, task_envs
from tests.support import gone, wait_for

pytestmark = pytest.mark.slurm


def test_srun_one_task_per_node(tmp_path: Path) -> None:
    envs = task_envs(tmp_path, "-N2", "-n2", "-w", "n[1-2]")
    assert len(envs) == 2
    for rank, env in enumerate(envs):
        assert env["SLURM_JOB_NODELIST"] == "n[1-2]"
        assert env["SLURM_STEP_NODELIST"] == "n[1-2]"
        assert (env["SLURM_PROCID"], env["SLURM_NODEID"], env["SLURM_LOCALID"]) == (str(rank), str(rank), "0")
        assert env["SLURMD_NODENAME"] == f"n{rank + 1}"
        assert (env["SLURM_NNODES"], env["SLURM_NTASKS"]) == ("2", "2")
        assert (env["SLURM_STEP_NUM_NODES"], env["SLURM_STEP_NUM_TASKS"]) == ("2", "2")
        assert env["SLURM_STEP_TASKS_PER_NODE"] == "1(x2)"
    assert envs[0]["SLURM_JOB_ID"] == envs[1]["SLURM_JOB_ID"]


def test_srun_two_tasks_per_node(tmp_path: Path) -> None:
    envs = task_envs(tmp_path, "-N2", "--ntasks-per-node=2", "-w", "n[1-2]")
    assert [e["SLURM_PROCID"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["SLURM_NODEID"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["SLURM_LOCALID"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["SLURMD_NODENAME"] for e in envs] == ["n1", "n1", "n2", "n2"]
    assert {e["SLURM_STEP_TASKS_PER_NODE"] for e in envs} == {"2(x2)"}
    assert {e["SLURM_TASKS_PER_NODE"] for e in envs} == {"2(x2)"}


def test_two_jobs_run_side_by_side(tmp_path: Path) -> None:
    """Two 2-node jobs at once (a CPU of each node each): every task waits until all four tasks have started."""
    wait_all = (
        "import os, pathlib, sys, time\n"
        "d = pathlib.Path(sys.argv[1]); (d / (sys.argv[2] + os.environ['SLURM_PROCID'])).touch()\n"
        "deadline = time.monotonic() + 30\n"
        "while len(list(d.glob('task*'))) < 4:\n"
        "    if time.monotonic() > deadline: sys.exit('the other job did not start')\n"
        "    time.sleep(0.05)\n"
    )
    procs = [
        subprocess.Popen(
            ["srun", "-N2", "-n2", "-t", "1", sys.executable, "-c", wait_all, str(tmp_path), f"task{tag}"],
            env=slurm_env(),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tag in "ab"
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out


@pytest.mark.parametrize("code", [0, 7])
def test_sbatch_wait_returns_the_exit_code(tmp_path: Path, code: int) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N2 -w n[1-2] --ntasks-per-node=1 -t 1 -J ddpboot-test -o {tmp_path}/out.txt\n"
        'echo "batch $SLURM_CONF"\n'
        "srun bash -c 'echo \"$SLURMD_NODENAME $SLURM_NODEID $SLURM_STEP_NODELIST $SLURM_CONF\"'\n"
        f"exit {code}\n"
    )
    out = slurm("sbatch", "--wait", str(script), cwd=tmp_path)
    assert out.returncode == code, out.stdout + out.stderr
    lines = sorted((tmp_path / "out.txt").read_text().splitlines())
    # The test cluster's SLURM_CONF reaches the batch script and its steps (sbatch exports the submitter's env).
    assert lines == [f"batch {CLUSTER_CONF}", f"n1 0 n[1-2] {CLUSTER_CONF}", f"n2 1 n[1-2] {CLUSTER_CONF}"]


def test_scancel_ends_the_jobs_processes(tmp_path: Path, jobs: list[str]) -> None:
    """Every process of the step ends, including a child that started a session of its own (as workers do)."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N2 --ntasks-per-node=1 -t 2 -J ddpboot-test -o {tmp_path}/out.txt\n"
        "srun bash -c 'setsid sleep 600 & echo $! > child.$SLURM_NODEID; echo $$ > task.$SLURM_NODEID; wait'\n"
    )
    out = slurm("sbatch", "--parsable", str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    jobs.append(job_id)

    names = [f"{kind}.{node}" for kind in ("task", "child") for node in (0, 1)]

    def written_pids() -> list[int] | None:
        try:
            return [int((tmp_path / name).read_text()) for name in names]
        except (FileNotFoundError, ValueError):  # not yet written
            return None

    pids: list[int] = wait_for(written_pids, 30, "the job's tasks to start", interval=0.1)
    assert not any(gone(pid) for pid in pids)

    assert slurm("scancel", job_id).returncode == 0
    wait_for(lambda: all(gone(pid) for pid in pids), 30, "the job's processes to end", interval=0.1)

    def job_ended() -> bool:
        state = slurm("squeue", "-h", "-j", job_id, "-o", "%T")
        return state.stdout.strip() not in ("PENDING", "RUNNING", "COMPLETING")

    wait_for(job_ended, 30, "squeue to drop the job", interval=0.1)
