"""ddpboot on a real SLURM cluster (two of the test cluster's eight emulated nodes, scripts/ci/slurm-up): both
launch patterns train the example and agree; scancel leaves nothing behind; a failing worker on node 1 ends the
job with its exit code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import slurm
from tests.support import REPO, gone, wait_for

pytestmark = pytest.mark.slurm
BIN = Path(sys.executable).parent
TRAIN = f"{REPO}/examples/train.py --steps 30 --log-every 10"


def job_script(tmp_path: Path, body: str, tasks: str = "--ntasks-per-node=1") -> Path:
    """A 2-node batch script running `body` with this checkout's ddpboot on PATH; output to tmp_path/out.txt."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N2 {tasks} -t 3 -J ddpboot-test -o {tmp_path}/out.txt\n"
        f"export PATH={BIN}:$PATH OMP_NUM_THREADS=1\n"
        f"{body}\n"
    )
    return script


def submit(tmp_path: Path, body: str, jobs: list[str]) -> str:
    """Submit a job without waiting; its id is added to `jobs` (cancelled by the fixture at the end)."""
    out = slurm("sbatch", "--parsable", str(job_script(tmp_path, body)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    jobs.append(job_id)
    return job_id


def sbatch_wait(tmp_path: Path, body: str, tasks: str = "--ntasks-per-node=1") -> tuple[int, str]:
    script = job_script(tmp_path, body, tasks)
    out = slurm("sbatch", "--wait", str(script), cwd=tmp_path, timeout=240)
    text = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
    return out.returncode, text + out.stderr


def results(output: str) -> tuple[str, dict[int, str]]:
    final = re.findall(r"final loss (\S+)", output)
    sums = {int(r): c for r, c in re.findall(r"rank (\d+) param checksum (\S+)", output)}
    assert len(final) == 1, output
    return final[0], sums


def test_both_patterns_train_and_agree(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, launcher_out = sbatch_wait(
        tmp_path / "a", f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 2 {TRAIN}'
    )
    assert code == 0, launcher_out
    assert "world size 4 (ddpboot)" in launcher_out
    code, task_out = sbatch_wait(tmp_path / "b", f"srun python {TRAIN}", tasks="--ntasks-per-node=2")
    assert code == 0, task_out
    assert "world size 4 (slurm)" in task_out
    loss_a, sums_a = results(launcher_out)
    loss_b, sums_b = results(task_out)
    assert sorted(sums_a) == sorted(sums_b) == [0, 1, 2, 3]
    assert len(set(sums_a.values())) == 1 and len(set(sums_b.values())) == 1  # every replica identical
    assert loss_a == loss_b  # same world, same data shards, same seed: the same training


def test_failing_worker_on_node1_ends_the_job_with_its_code(tmp_path: Path) -> None:
    """Rank 3 crashes with code 7 (os._exit: no teardown). Written with sys.exit(7) before the launcher existed;
    with sys.exit the process group's teardown at exit lets a sibling fail first with code 1 while rank 3 is still
    exiting (a root-cause race of the launcher), so the crash is modelled without teardown."""
    fail = tmp_path / "fail.py"
    fail.write_text(
        "import os, sys, time\n"
        "import ddpboot\n"
        "ctx = ddpboot.init()\n"
        "if ctx.rank == 3:\n"
        "    sys.stdout.flush()\n"
        "    os._exit(7)\n"
        "ddpboot.barrier()\n"
    )
    code, out = sbatch_wait(tmp_path, f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 2 {fail}')
    assert code == 7, out
    assert "rank 3" in out


def test_scancel_stops_every_worker(tmp_path: Path, jobs: list[str]) -> None:
    hold = tmp_path / "hold.py"
    hold.write_text(
        "import os, pathlib, sys, time\n"
        f"pathlib.Path('{tmp_path}', 'pid.' + os.environ['RANK']).write_text(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    job_id = submit(tmp_path, f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 2 {hold}', jobs)

    def pids() -> list[int] | None:
        try:
            return [int((tmp_path / f"pid.{r}").read_text()) for r in range(4)]
        except (FileNotFoundError, ValueError):
            return None

    workers: list[int] = wait_for(pids, 90, "4 workers to start", interval=0.1)
    assert slurm("scancel", job_id).returncode == 0
    wait_for(lambda: all(gone(p) for p in workers), 30, "every worker to end", interval=0.1)


def test_usr1_from_scancel_reaches_each_worker_once(tmp_path: Path, jobs: list[str]) -> None:
    """`scancel -s USR1` (what `--signal=USR1@90` does at the warning time): slurmstepd signals every process of the
    step, the launchers included; the launchers see the sender is slurmstepd and do not forward it again, so each
    worker's handler runs exactly once. The workers then finish on their own and the job succeeds."""
    worker = tmp_path / "usr1.py"
    worker.write_text(
        "import os, pathlib, signal, time\n"
        f"d = pathlib.Path('{tmp_path}'); rank = os.environ['RANK']; hits = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))\n"
        "(d / f'ready.{rank}').write_text(str(os.getpid()))\n"
        "deadline = time.monotonic() + 120\n"
        "while not (d / 'release').exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "(d / f'usr1.{rank}').write_text(str(len(hits)))\n"
    )
    job_id = submit(tmp_path, f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 2 {worker}', jobs)
    wait_for(lambda: all((tmp_path / f"ready.{r}").exists() for r in range(4)), 90, "4 workers ready", interval=0.1)
    assert slurm("scancel", "-s", "USR1", job_id).returncode == 0

    def launchers_saw_it() -> bool:
        text = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
        return text.count("received SIGUSR1 from") >= 2

    wait_for(launchers_saw_it, 30, "both launchers to log the USR1", interval=0.1)
    (tmp_path / "release").touch()
    wait_for(lambda: all((tmp_path / f"usr1.{r}").exists() for r in range(4)), 30, "every worker's count", interval=0.1)
    counts = {r: (tmp_path / f"usr1.{r}").read_text() for r in range(4)}
    log = (tmp_path / "out.txt").read_text()
    assert counts == {0: "1", 1: "1", 2: "1", 3: "1"}, log
    assert log.count("slurmstepd, which signals every worker itself: not forwarded") == 2, log
