"""Smoke test of the local SLURM test cluster (scripts/ci/slurm-up): two emulated nodes n1, n2 on this machine.

Checks the facts the SLURM support rests on (FACTS.md §4) against a real slurmctld/slurmd: what `srun` gives each
task, that `sbatch --wait` returns the batch script's exit code, and that `scancel` ends a job's processes.
Skips when no cluster is up; start one with `sudo scripts/ci/slurm-up`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

START_HINT = "start the test cluster with `sudo scripts/ci/slurm-up`"
# Each task prints its SLURM environment variables as JSON.
DUMP_ENV = [
    sys.executable,
    "-c",
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if 'SLURM' in k}))",
]


def slurm_env() -> dict[str, str]:
    """This process's environment without SLURM_* job variables (pytest may itself run inside a job)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def slurm(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=slurm_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    """Skip the module unless ddpboot's test cluster answers."""
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        pytest.skip(f"SLURM client tools (sinfo, srun) are not installed: {START_HINT} (it installs them)")
    try:
        ping = slurm("scontrol", "ping", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"`scontrol ping` did not answer within 20 s: {START_HINT}")
    if ping.returncode != 0 or "UP" not in ping.stdout:
        why = [line for line in (ping.stdout + ping.stderr).splitlines() if line.strip() and line[0] != "*"]
        pytest.skip(f"no SLURM controller answers `scontrol ping` ({why[-1] if why else 'no output'}): {START_HINT}")
    nodes = slurm("sinfo", "-h", "-N", "-o", "%N", timeout=20)
    if sorted(set(nodes.stdout.split())) != ["n1", "n2"]:
        pytest.skip(f"the SLURM cluster here is not ddpboot's test cluster (nodes n1, n2): {nodes.stdout.split()}")


def task_envs(tmp_path: Path, *srun_args: str) -> list[dict[str, str]]:
    """Run DUMP_ENV under `srun` (one output file per task: srun splits and interleaves long lines on its own
    stdout) and return the tasks' SLURM environments, ordered by SLURM_PROCID."""
    out = slurm("srun", *srun_args, "-t", "1", f"--output={tmp_path}/env.%t", *DUMP_ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    envs = [json.loads(path.read_text()) for path in tmp_path.glob("env.*")]
    return sorted(envs, key=lambda e: int(e["SLURM_PROCID"]))


def wait_for(what: str, done: Callable[[], Any], deadline_s: float = 30) -> Any:
    """Poll `done()` until it returns something true; fail after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while not (result := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.1)
    return result


def alive(pid: int) -> bool:
    """A process that has not exited (a zombie not yet reaped by its parent counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def jobs() -> Iterator[list[str]]:
    """Job ids a test submits; cancelled afterwards whatever happened."""
    ids: list[str] = []
    yield ids
    if ids:
        slurm("scancel", *ids, timeout=30)


def test_srun_one_task_per_node(tmp_path: Path) -> None:
    envs = task_envs(tmp_path, "-N2", "-n2")
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
    envs = task_envs(tmp_path, "-N2", "--ntasks-per-node=2")
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
        f"#SBATCH -N2 --ntasks-per-node=1 -t 1 -J ddpboot-test -o {tmp_path}/out.txt\n"
        "srun bash -c 'echo \"$SLURMD_NODENAME $SLURM_NODEID $SLURM_STEP_NODELIST\"'\n"
        f"exit {code}\n"
    )
    out = slurm("sbatch", "--wait", str(script), cwd=tmp_path)
    assert out.returncode == code, out.stdout + out.stderr
    lines = sorted((tmp_path / "out.txt").read_text().splitlines())
    assert lines == ["n1 0 n[1-2]", "n2 1 n[1-2]"]


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

    pids: list[int] = wait_for("the job's tasks to start", written_pids)
    assert all(alive(pid) for pid in pids)

    assert slurm("scancel", job_id).returncode == 0
    wait_for("the job's processes to end", lambda: not any(alive(pid) for pid in pids))

    def job_ended() -> bool:
        state = slurm("squeue", "-h", "-j", job_id, "-o", "%T")
        return state.stdout.strip() not in ("PENDING", "RUNNING", "COMPLETING")

    wait_for("squeue to drop the job", job_ended)
