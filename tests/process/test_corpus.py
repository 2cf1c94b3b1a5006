"""A corpus of training scripts written the way the ecosystem writes them (tests/process/scripts/corpus/, described
in docs/corpus.md), each run as `ddpboot --nproc 2 --cpu SCRIPT` and as `python -m torch.distributed.run
--standalone --nproc-per-node 2 SCRIPT`: the two jobs must end alike.

Alike means: both exit 0 or both exit non-zero (ddpboot exits with the failing rank's code, torchrun with 1:
docs/guide.md), every rank writes the same result under both (world size, backend, parameter checksums after
training; corpus_results.py drops what depends on the launcher), and no process the job started is alive once its
launcher has exited. Every process a job starts inherits a tag in its environment (CORPUS_JOB); the check looks for
that tag among all processes, and for every pid a rank recorded (its own, its DataLoader workers, its Pool).

The two launchers of a pattern run side by side (their jobs share nothing), each job once; patterns 1 to 4 share one
job (device_idioms.py), and so do pattern 9 and pattern 10's failing variant (failing_rank.py). torchrun gets
--log-dir inside the test's directory and every job its own TMPDIR: what a job leaves there must not depend on the
launcher.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import SCRIPTS, TIMEOUT, clean_env, ddpboot_exe, gone, ranks_named, tagged, wait_for

CORPUS = SCRIPTS / "corpus"
LAUNCHERS = ("ddpboot", "torchrun")
# tempfile's random part of a name (pymp-XXXXXXXX/listener-XXXXXXXX: multiprocessing's, left by a killed rank).
TEMP_NAME = re.compile(r"-[a-z0-9_]{8}\b")
# What a rank reports that depends on the launcher, not on the training: pids, LOCAL_RANK (0 in every ddpboot
# worker under rank isolation: docs/guide.md), the path of its error file.
LAUNCHER_FACTS = {"pid", "local_rank_env", "children", "loader_pids", "pool_pids", "error_file"}


@dataclass(frozen=True)
class Job:
    launcher: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    results: dict[int, dict[str, Any]]
    survivors: list[str]  # processes of the job, and pids its ranks recorded, alive after its launcher exited
    leftovers: list[str]  # what the job left in its TMPDIR, random parts of names as "-*"
    logs: Path

    def comparable(self) -> dict[int, dict[str, Any]]:
        return {rank: {k: v for k, v in r.items() if k not in LAUNCHER_FACTS} for rank, r in self.results.items()}

    def __str__(self) -> str:
        return (f"{self.launcher} exited {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n"
                f"stderr:\n{self.stderr[-3000:]}")




def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return str(proc.pid)


def command(launcher: str, script: str, args: list[str], logs: Path, log_dir: bool) -> list[str]:
    if launcher == "ddpboot":
        return [*ddpboot_exe(), "--nproc", "2", "--cpu", *(["--log-dir", str(logs)] if log_dir else []),
                str(CORPUS / script), *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--log-dir", str(logs), str(CORPUS / script), *args]


def recorded_pids(results: dict[int, dict[str, Any]]) -> set[int]:
    """Every pid the ranks wrote down: their own and their children's."""
    pids: set[int] = set()
    for result in results.values():
        pids.add(result["pid"])
        for key in ("children", "loader_pids", "pool_pids"):
            pids.update(result.get(key, ()))
    return pids


def run_job(launcher: str, script: str, args: list[str], base: Path, log_dir: bool) -> Job:
    out, logs = base / launcher / "out", base / launcher / "logs"
    out.mkdir(parents=True)
    # The ranks' TMPDIR, short whatever pytest's own temporary directories are (an xdist worker's are longer, and
    # so are another user's): multiprocessing's sockets below it must fit a unix socket's path (ddpboot says so).
    tmp = Path(tempfile.mkdtemp(prefix="ddpboot-corpus-", dir="/tmp"))
    try:
        return _run_job(launcher, command(launcher, script, args, logs, log_dir), out, tmp, logs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_job(launcher: str, cmd: list[str], out: Path, tmp: Path, logs: Path) -> Job:
    tag = uuid.uuid4().hex
    env = clean_env(CORPUS_OUT=str(out), CORPUS_JOB=tag, TMPDIR=str(tmp))
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT, start_new_session=True)
        seconds = time.monotonic() - start
        results = {}
        for path in out.glob("*.json"):
            data = json.loads(path.read_text())
            results[int(data["rank"])] = data
        alive = {p.pid: describe(p) for p in tagged(tag) if not gone(p.pid)}
        alive.update({pid: f"{pid} (recorded by a rank)" for pid in recorded_pids(results) - set(alive)
                      if not gone(pid)})
    finally:
        for leftover in tagged(tag):  # never leave them to the next test
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
    leftovers = sorted(TEMP_NAME.sub("-*", str(p.relative_to(tmp))) for p in tmp.rglob("*"))
    return Job(launcher, proc.returncode, proc.stdout, proc.stderr, seconds, results, sorted(alive.values()),
               leftovers, logs)


def run_both(script: str, args: list[str], base: Path, log_dir: bool = False) -> dict[str, Job]:
    """The script under each launcher, side by side; every job's processes checked once its launcher is gone."""
    with ThreadPoolExecutor(len(LAUNCHERS)) as pool:
        futures = {name: pool.submit(run_job, name, script, args, base, log_dir) for name in LAUNCHERS}
        jobs = {name: future.result() for name, future in futures.items()}
    for job in jobs.values():
        print(f"{script} {' '.join(args)} under {job.launcher}: exit {job.returncode} in {job.seconds:.1f} s")
    return jobs


def assert_same_outcome(jobs: dict[str, Job], ok: bool) -> None:
    for job in jobs.values():
        assert (job.returncode == 0) == ok, str(job)
        assert job.survivors == [], f"{job.launcher}: processes of the job outlived it: {job.survivors}\n{job}"
    ours, theirs = jobs["ddpboot"], jobs["torchrun"]
    assert ours.comparable() == theirs.comparable(), f"ddpboot: {ours.results}\ntorchrun: {theirs.results}"
    # What the ranks leave in TMPDIR is theirs (torch's DDP creates torchinductor_USER there, a rank killed while
    # its DataLoader runs leaves multiprocessing's pymp-* directories); a launcher adds nothing.
    assert ours.leftovers == theirs.leftovers, f"TMPDIR after ddpboot: {ours.leftovers}; torchrun: {theirs.leftovers}"


def test_the_outlive_check_sees_a_process_of_the_job() -> None:
    """The check behind every test here finds a live process by its tag (it could not fail otherwise)."""
    tag = uuid.uuid4().hex
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                          env=clean_env(CORPUS_JOB=tag)) as child:
        try:
            assert [p.pid for p in wait_for(lambda: tagged(tag), TIMEOUT, "the tagged process")] == [child.pid]
        finally:
            assert child.stdin is not None
            child.stdin.close()
    assert tagged(tag) == []


# --- patterns 1 to 4: choosing the device and the backend -----------------------------------------------------


@pytest.fixture(scope="module")
def idioms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    jobs = run_both("device_idioms.py", [], tmp_path_factory.mktemp("idioms"))
    assert_same_outcome(jobs, ok=True)
    return jobs


@pytest.mark.parametrize(
    "idiom",
    [
        pytest.param("tutorial", id="1-torchrun-tutorial"),
        pytest.param("rank_modulo", id="2-rank-modulo-device-count"),
        pytest.param("count_check_cuda", id="3-device-count-check-cuda"),
        pytest.param("count_check_accelerator", id="3-device-count-check-accelerator"),
        pytest.param("accelerator", id="4-torch-accelerator"),
    ],
)
def test_device_idiom(idiom: str, idioms: dict[str, Job]) -> None:
    for job in idioms.values():
        assert sorted(job.results) == [0, 1], str(job)
        seen = [job.results[rank]["idioms"][idiom] for rank in (0, 1)]
        assert seen[0] == seen[1], f"{job.launcher}: the ranks disagree after DDP: {seen}"  # DDP keeps replicas equal
        assert seen[0]["device"] == "cpu" and seen[0]["backend"] == "gloo", seen
        assert job.results[0]["world_size"] == 2


def test_local_rank_is_the_documented_difference(idioms: dict[str, Job]) -> None:
    """torchrun's LOCAL_RANK is the node-local index; ddpboot's is 0 in every worker under rank isolation
    (docs/guide.md, "What LOCAL_RANK means"), the tutorial's set_device(LOCAL_RANK) naming each rank's own GPU."""
    assert {r: d["local_rank_env"] for r, d in idioms["torchrun"].results.items()} == {0: "0", 1: "1"}
    assert {r: d["local_rank_env"] for r, d in idioms["ddpboot"].results.items()} == {0: "0", 1: "0"}


def test_unguarded_device_count_check_exits_alike(tmp_path: Path) -> None:
    """Pattern 3 as the examples write it: without GPUs every rank prints the message and exits 0 at once."""
    jobs = run_both("device_count_check.py", [], tmp_path)
    assert_same_outcome(jobs, ok=True)
    said = "Unable to locate sufficient 2 gpus to run this example. Exiting."
    assert jobs["torchrun"].stdout.count(said) == 2, str(jobs["torchrun"])
    # ddpboot: once naming both ranks when they print it within the collapse window, else once per rank
    assert sorted(ranks_named(jobs["ddpboot"].stdout, said)) == [0, 1], str(jobs["ddpboot"])
    for job in jobs.values():
        assert job.results == {}


# --- patterns 5 and 6: FSDP2 and DTensor on a CPU device mesh -------------------------------------------------------


def test_fsdp2_and_dtensor_on_a_cpu_mesh(tmp_path: Path) -> None:
    jobs = run_both("mesh.py", [], tmp_path)
    assert_same_outcome(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == [0, 1], str(job)
        first = job.results[0]
        assert first["dtensor"] == {"local_shape": [4, 3], "replicated_equal": True, "full_equal": True,
                                    "sum": 552.0}
        assert job.results[1]["fsdp_checksum"] == first["fsdp_checksum"]


# --- patterns 7 and 8: accelerate and Lightning Fabric ----------------------------------------------------------


def test_accelerate(tmp_path: Path) -> None:
    jobs = run_both("accelerate_step.py", [], tmp_path)
    assert_same_outcome(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == [0, 1], str(job)
        for result in job.results.values():
            assert result["distributed_type"] == "DistributedType.MULTI_CPU"
            assert (result["world_size"], result["backend"], result["steps"]) == (2, "gloo", 2)
        assert job.results[0]["checksum"] == job.results[1]["checksum"]


def test_lightning_fabric_joins_the_launchers_job(tmp_path: Path) -> None:
    jobs = run_both("fabric_step.py", [], tmp_path)
    assert_same_outcome(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == [0, 1], str(job)
        for result in job.results.values():
            assert result["environment"] == "TorchElasticEnvironment"
            assert result["children"] == [], f"{job.launcher}: Fabric started processes of its own: {result}"
            assert result["world_size"] == 2 and result["run_id_seen"]
        assert job.results[0]["checksum"] == job.results[1]["checksum"]


# --- patterns 9 and 10: @record, a failing rank, ranks with children of their own ---------------------------------


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """failing_rank.py: rank 1 raises under @record while both ranks' children are alive and rank 0 is running.
    With --log-dir under both launchers, so that the error files stay for the test to read."""
    jobs = run_both("failing_rank.py", [], tmp_path_factory.mktemp("failing"), log_dir=True)
    assert_same_outcome(jobs, ok=False)
    return jobs


def test_record_writes_the_error_file_and_both_report_it(failing: dict[str, Job]) -> None:
    message = "corpus: rank 1 fails on purpose"
    for job in failing.values():
        # An uncaught exception exits 1, so both launchers exit 1 (ddpboot: the failing rank's code).
        assert job.returncode == 1, str(job)
        error_file = Path(job.results[1]["error_file"])
        assert error_file.is_relative_to(job.logs), f"{job.launcher}: {error_file} is not under --log-dir"
        assert error_file.exists(), f"{job.launcher}: rank 1 wrote no {error_file}\n{job}"
        assert message in error_file.read_text()
        assert message in job.stderr, f"{job.launcher} did not report the failing rank's error\n{job}"


def test_children_of_a_failed_job_end_with_it(failing: dict[str, Job]) -> None:
    """The fixture has checked that no process of either job outlived it; here, that there were children to
    outlive it: the DataLoader's two workers and the Pool's, alive when each rank recorded them."""
    for job in failing.values():
        assert sorted(job.results) == [0, 1], str(job)
        for result in job.results.values():
            assert result["children_alive"] and len(result["children"]) >= 4, result
            assert len(result["loader_pids"]) == 2 and result["pool_pids"], result


def test_children_of_a_successful_job_end_with_it(tmp_path: Path) -> None:
    jobs = run_both("children.py", [], tmp_path)
    assert_same_outcome(jobs, ok=True)
    for job in jobs.values():
        assert sorted(job.results) == [0, 1], str(job)
        for result in job.results.values():
            assert result["children_alive"] and len(result["children"]) >= 4, result
            assert len(result["loader_pids"]) == 2 and result["pool_pids"], result
