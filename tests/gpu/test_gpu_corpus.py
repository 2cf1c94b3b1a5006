"""The script corpus (tests/process/scripts/corpus/, docs/corpus.md) on real GPUs with nccl: each pattern run under
ddpboot (rank isolation, its default), under `ddpboot --isolation node` and under torchrun
(`python -m torch.distributed.run --standalone`), and the jobs must end alike, or differ exactly as documented.

The GPU twin of tests/process/test_corpus.py: the same scripts, given `--device cuda` where they take it, one rank
per GPU, two ranks where the machine has two GPUs and one where it has one. Alike means: the same exit status, every
rank the same result under each launcher (checksums to float tolerance: the same kernels on the same GPU model),
each rank on a GPU of its own, and no process of the job alive once its launcher has exited.

    python3 -m pytest -q -m gpu tests/gpu/test_gpu_corpus.py
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import SCRIPTS, clean_env, ddpboot_exe, gone, gpu_count, tagged

pytestmark = pytest.mark.gpu
CORPUS = SCRIPTS / "corpus"
TIMEOUT = 300
LAUNCHERS = {
    "ddpboot": ["--isolation", "rank"],
    "ddpboot-node": ["--isolation", "node"],
    "torchrun": [],
}
UNABLE = "Unable to locate sufficient"


@pytest.fixture(scope="module")
def nproc() -> int:
    """One rank per GPU, at most two: the corpus's jobs are two-rank jobs, one-rank where one GPU is all there is."""
    count = gpu_count()
    if count == 0:
        pytest.skip("nvidia-smi lists no GPU")
    return min(count, 2)


@dataclass(frozen=True)
class Job:
    launcher: str
    returncode: int
    stdout: str
    stderr: str
    results: dict[int, dict[str, Any]]
    survivors: list[str]
    logs: Path

    def __str__(self) -> str:
        return (f"{self.launcher} exited {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n"
                f"stderr:\n{self.stderr[-3000:]}")




def command(launcher: str, nproc: int, script: str, args: list[str], logs: Path, log_dir: bool) -> list[str]:
    """torchrun always gets --log-dir (its error files go there); ddpboot only where the test reads them."""
    if launcher.startswith("ddpboot"):
        return [*ddpboot_exe(), "--nproc", str(nproc), *LAUNCHERS[launcher],
                *(["--log-dir", str(logs)] if log_dir else []), str(CORPUS / script), *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--log-dir", str(logs), str(CORPUS / script), *args]


def run_job(launcher: str, nproc: int, script: str, args: list[str], base: Path, log_dir: bool) -> Job:
    out, logs = base / launcher / "out", base / launcher / "logs"
    out.mkdir(parents=True)
    tag = uuid.uuid4().hex
    env = clean_env(CORPUS_OUT=str(out), CORPUS_JOB=tag, NCCL_NVLS_ENABLE="0")
    try:
        proc = subprocess.run(command(launcher, nproc, script, args, logs, log_dir), env=env, capture_output=True,
                              text=True, timeout=TIMEOUT, start_new_session=True)
        results = {}
        for path in out.glob("*.json"):
            data = json.loads(path.read_text())
            results[int(data["rank"])] = data
        pids = {int(r["pid"]) for r in results.values()}
        for result in results.values():
            for key in ("children", "loader_pids", "pool_pids"):
                pids.update(result.get(key, ()))
        alive = [f"{p.pid} {' '.join(p.cmdline())[:200]}" for p in tagged(tag) if not gone(p.pid)]
        alive += [f"{pid} (recorded by a rank)" for pid in sorted(pids) if not gone(pid)]
    finally:
        for leftover in tagged(tag):
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
    return Job(launcher, proc.returncode, proc.stdout, proc.stderr, results, alive, logs)


def run_all(script: str, args: list[str], base: Path, nproc: int,
            launchers: dict[str, list[str]] | None = None, log_dir: bool = False) -> dict[str, Job]:
    """The script under each launcher, one job after another (each job takes every GPU it is given)."""
    jobs = {}
    for launcher, extra in (launchers or {name: [] for name in LAUNCHERS}).items():
        start = time.monotonic()
        jobs[launcher] = run_job(launcher, nproc, script, [*args, *extra], base, log_dir)
        print(f"{script} {' '.join(args + extra)} under {launcher}: exit {jobs[launcher].returncode} "
              f"in {time.monotonic() - start:.1f} s")
    return jobs


def assert_clean_exit(jobs: dict[str, Job], ok: bool) -> None:
    for job in jobs.values():
        assert (job.returncode == 0) == ok, str(job)
        assert job.survivors == [], f"{job.launcher}: processes of the job outlived it: {job.survivors}\n{job}"


def assert_own_gpus(job: Job, nproc: int, uuids: list[str | None]) -> None:
    assert None not in uuids and len(set(uuids)) == nproc, f"{job.launcher}: ranks share or lack GPUs: {uuids}"


def test_device_idioms_on_gpus(tmp_path: Path, nproc: int) -> None:
    """Patterns 1, 2 and 4 (set_device(LOCAL_RANK), RANK % device_count(), torch.accelerator) on nccl, and pattern 3
    (device-count checks) where every rank sees the GPUs it counts: torchrun and --isolation node. Under rank
    isolation the count checks stop a two-rank job (pattern 3's test below), so ddpboot runs the other three."""
    counted = ["tutorial", "rank_modulo", "accelerator"]
    jobs = run_all("device_idioms.py", [], tmp_path, nproc, {
        "ddpboot": ["--only", ",".join(counted)] if nproc > 1 else [],
        "ddpboot-node": [],
        "torchrun": [],
    })
    assert_clean_exit(jobs, ok=True)
    reference = jobs["torchrun"].results
    for job in jobs.values():
        assert sorted(job.results) == list(range(nproc)), str(job)
        for name, seen in job.results[0]["idioms"].items():
            per_rank = [job.results[rank]["idioms"][name] for rank in range(nproc)]
            assert {(s["backend"], s["device"].split(":")[0]) for s in per_rank} == {("nccl", "cuda")}, per_rank
            assert_own_gpus(job, nproc, [s["gpu"] for s in per_rank])
            # DDP keeps the replicas equal, and the launcher must not change what was trained.
            assert {s["checksum"] for s in per_rank} == {seen["checksum"]}, f"{job.launcher} {name}: {per_rank}"
            assert seen["checksum"] == pytest.approx(reference[0]["idioms"][name]["checksum"], rel=1e-5), name
        assert job.results[0]["accelerator"] == "cuda"
    # What each rank sees: every GPU of the job under torchrun and --isolation node, its own one under rank isolation.
    assert {r["cuda_devices"] for r in jobs["torchrun"].results.values()} == {gpu_count()}
    assert {r["cuda_devices"] for r in jobs["ddpboot-node"].results.values()} == {nproc}
    assert {r["cuda_devices"] for r in jobs["ddpboot"].results.values()} == {1}


def test_device_count_check_on_gpus(tmp_path: Path, nproc: int) -> None:
    """Pattern 3 unguarded. torchrun and --isolation node: every rank sees the GPUs and trains. Rank isolation with two
    ranks: each sees one GPU, prints the message and exits 0 having trained nothing; ddpboot names the count before
    starting and says after the job that no rank joined (docs/guide.md). With one GPU the three agree."""
    jobs = run_all("device_count_check.py", [], tmp_path, nproc)
    assert_clean_exit(jobs, ok=True)
    joined = ["torchrun", "ddpboot-node"] if nproc > 1 else list(LAUNCHERS)
    for name in joined:
        job = jobs[name]
        assert sorted(job.results) == list(range(nproc)), str(job)
        assert {r["all_reduce"] for r in job.results.values()} == {float(nproc)}
        assert_own_gpus(job, nproc, [r["gpu"] for r in job.results.values()])
        assert UNABLE not in job.stdout
    if nproc > 1:
        isolated = jobs["ddpboot"]
        assert isolated.results == {}, str(isolated)
        assert isolated.stdout.count(UNABLE) == nproc, str(isolated)
        said = isolated.stdout + isolated.stderr
        assert re.search(r"device_count_check\.py:\d+ counts GPUs", said) and "--isolation node" in said, str(isolated)
        assert "no rank joined the job" in said, str(isolated)


def test_fsdp2_and_dtensor_on_gpus(tmp_path: Path, nproc: int) -> None:
    """Patterns 5 and 6 on a CUDA mesh: init_device_mesh("cuda"), DTensor Shard(0) → Replicate, fully_shard."""
    jobs = run_all("mesh.py", ["--device", "cuda"], tmp_path, nproc, {"ddpboot": [], "torchrun": []})
    assert_clean_exit(jobs, ok=True)
    rows = 8 // nproc
    for job in jobs.values():
        assert sorted(job.results) == list(range(nproc)), str(job)
        first = job.results[0]
        assert first["dtensor"] == {"local_shape": [rows, 3], "replicated_equal": True, "full_equal": True,
                                    "sum": 552.0}
        assert {r["fsdp_checksum"] for r in job.results.values()} == {first["fsdp_checksum"]}
    assert jobs["ddpboot"].results[0]["fsdp_checksum"] == pytest.approx(
        jobs["torchrun"].results[0]["fsdp_checksum"], rel=1e-5)


def test_children_on_gpus_end_with_the_job(tmp_path: Path, nproc: int) -> None:
    """Pattern 10 with an nccl group: DataLoader workers and an open Pool, alive when main returns; none outlives."""
    jobs = run_all("children.py", ["--device", "cuda"], tmp_path, nproc, {"ddpboot": [], "torchrun": []})
    assert_clean_exit(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == list(range(nproc)), str(job)
        assert_own_gpus(job, nproc, [r["gpu"] for r in job.results.values()])
        for result in job.results.values():
            assert result["backend"] == "nccl" and result["children_alive"] and len(result["children"]) >= 4, result


def test_record_and_children_of_a_failed_gpu_job(tmp_path: Path, nproc: int) -> None:
    """Patterns 9 and 10: rank 1 raises under @record, rank 0 keeps running with its children: both launchers exit 1,
    the error file holds the traceback, nothing of the job survives."""
    if nproc < 2:
        pytest.skip("rank 1 fails in this job: needs 2 GPUs, this machine has 1")
    jobs = run_all("failing_rank.py", ["--device", "cuda"], tmp_path, nproc, {"ddpboot": [], "torchrun": []},
                   log_dir=True)
    assert_clean_exit(jobs, ok=False)
    for job in jobs.values():
        assert job.returncode == 1, str(job)
        assert sorted(job.results) == [0, 1], str(job)
        error_file = Path(job.results[1]["error_file"])
        assert error_file.is_relative_to(job.logs) and error_file.exists(), f"{job.launcher}: {error_file}\n{job}"
        assert "corpus: rank 1 fails on purpose" in error_file.read_text()
        assert "corpus: rank 1 fails on purpose" in job.stderr, str(job)


def test_accelerate_on_gpus(tmp_path: Path, nproc: int) -> None:
    """Pattern 7: a bare-device Accelerator() finds the job and its GPU under each launcher (LOCAL_RANK picks it)."""
    pytest.importorskip("accelerate", reason="accelerate is not installed here")
    jobs = run_all("accelerate_step.py", [], tmp_path, nproc, {"ddpboot": [], "torchrun": []})
    assert_clean_exit(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == list(range(nproc)), str(job)
        for result in job.results.values():
            assert result["backend"] == "nccl" and result["device"].startswith("cuda"), result
    assert jobs["ddpboot"].results[0]["checksum"] == pytest.approx(jobs["torchrun"].results[0]["checksum"], rel=1e-5)


def test_lightning_fabric_on_gpus(tmp_path: Path, nproc: int) -> None:
    """Pattern 8: Fabric(accelerator="cuda", devices=N) joins the launcher's job. It asks for N visible GPUs, which
    rank isolation does not give (each rank sees one): it runs under torchrun and --isolation node."""
    pytest.importorskip("lightning_fabric", reason="lightning_fabric is not installed here")
    jobs = run_all("fabric_step.py", ["--device", "cuda"], tmp_path, nproc, {"ddpboot-node": [], "torchrun": []})
    assert_clean_exit(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == list(range(nproc)), str(job)
        for result in job.results.values():
            assert result["environment"] == "TorchElasticEnvironment" and result["children"] == [], result
