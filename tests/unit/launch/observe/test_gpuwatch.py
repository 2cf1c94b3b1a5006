"""--gpu-watch's decisions: whose process is where, what is wrong, and what each finding says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.observe.base import End
from ddpboot.launch.observe.gpuwatch import GpuWatch, RankGpus, findings, health_findings, owners
from ddpboot.launch.observe.status import read_status
from ddpboot.launch.procs.leftovers import Proc
from ddpboot.launch.spec import GPU_WATCH_EXIT, WatchMode
from ddpboot.selection.activity import GpuHealth, GpuProcess
from ddpboot.selection.ledger import failing
from tests.unit.launch.observe.jobs import Attempt, Clock, gpu, job, slot, worker

MIB = 1 << 20
RUN = Path("/tmp/ddpboot-x")
R0 = RankGpus(0, 100, frozenset({"GPU-a"}), "GPU 0")
R1 = RankGpus(1, 200, frozenset({"GPU-b"}), "GPU 1")


def proc(pid: int, ppid: int, cmd: str = "python train.py", error_file: str | None = None, uid: int = -1) -> Proc:
    return Proc(pid, ppid, os.getuid() if uid == -1 else uid, pid, cmd, error_file)


TABLE = {p.pid: p for p in [
    proc(1, 0, "init"), proc(50, 1, "ddpboot"), proc(100, 50), proc(200, 50), proc(101, 100),
    proc(102, 101, "nvidia-smi"), proc(300, 1, "daemon", f"{RUN}/attempt_0/rank1.error.json"),
    proc(400, 1, "python other.py", uid=0),
]}


def test_a_ranks_process_is_it_and_every_descendant_and_whatever_carries_its_mark() -> None:
    assert owners(TABLE, [R0, R1], RUN) == {100: 0, 101: 0, 102: 0, 200: 1, 300: 1}
    assert 300 not in owners(TABLE, [R0, R1], None)


def test_wrong_gpu_names_the_rank_what_the_process_is_and_the_causes() -> None:
    procs = [GpuProcess("GPU-b", "1", 101, 512 * MIB), GpuProcess("GPU-b", "1", 102, None),
             GpuProcess("GPU-a", "0", 300, 0)]
    found = findings(procs, [R0, R1], TABLE, owners(TABLE, [R0, R1], RUN), 50)
    assert [f.key for f in found] == [("wrong", 0, "GPU-b"), ("wrong", 0, "GPU-b")]
    assert all(f.wrong_gpu for f in found)
    assert found[0].text.startswith("ddpboot: gpu watch: rank 0 (a process forked by the rank, such as a DataLoader "
                                    "worker, pid 101) holds 512 MiB on GPU 1, which is not its GPU (rank 0 runs on "
                                    "GPU 0). Likely causes: a barrier() or init_process_group() without device_id")
    assert "(a process the rank started, pid 102 (nvidia-smi)) holds an unknown amount of memory" in found[1].text


def test_a_stranger_on_a_job_gpu_is_named_but_not_one_elsewhere_nor_the_launcher() -> None:
    procs = [GpuProcess("GPU-a", "0", 400, 2048 * MIB), GpuProcess("GPU-z", "7", 400, MIB),
             GpuProcess("GPU-a", "0", 50, MIB), GpuProcess("GPU-a", "0", 100, MIB)]
    [f] = findings(procs, [R0, R1], TABLE, owners(TABLE, [R0, R1], RUN), 50)
    assert f.key == ("stranger", 400, "GPU-a") and not f.wrong_gpu
    assert f.text == ("ddpboot: gpu watch: pid 400 (root: python other.py) is not this job's and uses 2048 MiB on "
                      "GPU 0, the GPU of rank 0")


def test_pids_this_launcher_cannot_see_are_said_once_and_nothing_else() -> None:
    procs = [GpuProcess("GPU-a", "0", 99999, MIB), GpuProcess("GPU-b", "1", 99998, MIB)]
    [f] = findings(procs, [R0, R1], TABLE, owners(TABLE, [R0, R1], RUN), 50)
    assert f.key == ("unseen",) and "another pid namespace" in f.text


def test_the_mode_is_parsed_with_the_choices_named() -> None:
    assert WatchMode.parse(" Strict", "--gpu-watch") is WatchMode.STRICT
    with pytest.raises(UsageError, match=r"--gpu-watch 'loud': choose warn .* strict .* exit code 125 .* or off"):
        WatchMode.parse("loud", "--gpu-watch")


def health(uuid: str = "GPU-a", used: int = 10, **kw: object) -> GpuHealth:
    return GpuHealth(uuid, "0" if uuid == "GPU-a" else "1", 100 * 2**30, used * 2**30, **kw)  # type: ignore[arg-type]


def test_a_job_gpu_that_is_nearly_full_slowed_failing_or_erring_is_named_with_its_ranks() -> None:
    sick = health(used=96, slowdowns=("thermal slowdown",), ecc_uncorrected=5, xids=(79,))
    found = health_findings([sick, health("GPU-b"), health("GPU-z", used=99)], [R0, R1], {"GPU-a": 3})
    assert [f.key for f in found] == [("memory", "GPU-a"), ("slow", "GPU-a", "thermal slowdown"),
                                      ("ecc", "GPU-a", 5), ("xid", "GPU-a", 79)]
    texts = [f.text for f in found]
    assert texts[0] == ("ddpboot: gpu watch: GPU 0 (rank 0) is 96% full (96.0 of 100.0 GiB): the next allocation "
                        "may fail with CUDA out of memory")
    assert texts[1].startswith("ddpboot: gpu watch: GPU 0 (rank 0) slows its clocks: thermal slowdown;")
    assert "reports 2 new uncorrected ECC errors during this job (5 since the driver loaded)" in texts[2]
    assert "reported Xid 79" in texts[3]
    assert not any(f.wrong_gpu for f in found)


def test_ecc_errors_from_before_the_job_or_unreported_are_no_finding() -> None:
    assert health_findings([health(ecc_uncorrected=4)], [R0], {"GPU-a": 4}) == []
    assert health_findings([health(ecc_uncorrected=None)], [R0], {"GPU-a": None}) == []
    assert health_findings([health(used=94)], [R0], {}) == []


def test_a_mig_ranks_process_listed_under_its_physical_gpu_is_no_finding() -> None:
    """NVML reports a MIG instance's processes under the GPU that holds it (as root); the rank has the MIG UUID."""
    mig = RankGpus(0, 100, frozenset({"MIG-a1"}), "GPU 3:1", frozenset({"3"}))
    procs = [GpuProcess("GPU-parent3", "3", 100, 512 * MIB), GpuProcess("GPU-other", "4", 101, 512 * MIB)]
    found = findings(procs, [mig], TABLE, owners(TABLE, [mig], RUN), 50)
    assert [f.key for f in found] == [("wrong", 0, "GPU-other")]  # GPU 4 is not its GPU; GPU 3 holds its instance


def test_as_an_observer_it_looks_every_interval_and_strict_ends_the_attempt(tmp_path: Path) -> None:
    """This test process plays rank 0, on GPU 0, and holds memory on GPU 1 in the simulated inventory."""
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps([
        {"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b", "processes": [
            {"pid": os.getpid(), "used_memory": 512 * MIB}]}]))
    clock, said = Clock(10.0), []
    env = {"DDPBOOT_FAKE_GPUS": str(inventory)}
    assert GpuWatch.start(job(tmp_path, clock, said, env=env)) is None  # no rank has a GPU
    slots = (slot(0, (gpu(0),)),)
    assert GpuWatch.start(job(tmp_path, clock, said, slots, env=env, gpu_watch=WatchMode.OFF)) is None
    j = job(tmp_path, clock, said, slots, env=env, gpu_watch=WatchMode.STRICT, gpu_watch_interval=5.0)
    watch = GpuWatch.start(j)
    assert watch is not None and watch.due(10.0) == 15.0
    running = Attempt([worker(0, os.getpid(), (gpu(0),))])
    assert watch.on_wake(12.0, running) == () and not said  # not due yet
    assert watch.on_wake(15.0, running) == (End(GPU_WATCH_EXIT, "--gpu-watch strict"),)
    assert len(said) == 1 and said[0].startswith("ddpboot: gpu watch: rank 0 (the rank itself) holds 512 MiB on GPU 1")
    assert said[0].endswith(f"; --gpu-watch strict: ending the job (exit code {GPU_WATCH_EXIT})")
    assert watch.due(15.0) == 20.0 and watch.on_wake(20.0, running) == ()  # said once, ended once
    watch.close()
    j.status.update([])  # the warning is kept for `ddpboot top`
    data = read_status(tmp_path)
    assert data is not None and list(data.warnings) == said


def test_what_means_a_gpu_is_failing_is_for_the_health_ledger_and_nothing_else() -> None:
    sick = health(used=96, slowdowns=("thermal slowdown",), ecc_uncorrected=5, xids=(13, 79, 94))
    found = {f.key: f.failing for f in health_findings([sick], [R0], {"GPU-a": 3})}
    assert found == {("memory", "GPU-a"): None, ("slow", "GPU-a", "thermal slowdown"): None,
                     ("ecc", "GPU-a", 5): ("GPU-a", "0", "uncorrected ECC errors grew by 2"),
                     ("xid", "GPU-a", 13): None,  # an application's error: the GPU is fine
                     ("xid", "GPU-a", 79): ("GPU-a", "0", "Xid 79 (the GPU has fallen off the bus)"),
                     ("xid", "GPU-a", 94): ("GPU-a", "0", "Xid 94 (a contained ECC error)")}


def test_the_watch_marks_a_failing_gpu_once_in_the_lock_directory(tmp_path: Path, lockdir: Path) -> None:
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps([{"index": 0, "uuid": "GPU-a", "xids": [13, 79]}, {"index": 1, "uuid": "GPU-b"}]))
    clock, said = Clock(10.0), []
    env = {"DDPBOOT_FAKE_GPUS": str(inventory), "DDPBOOT_LOCK_DIR": str(lockdir)}
    j = job(tmp_path, clock, said, (slot(0, (gpu(0),)),), env=env, run_id="job-9", gpu_watch_interval=1.0)
    watch = GpuWatch.start(j)
    assert watch is not None
    running = Attempt([worker(0, os.getpid(), (gpu(0),))])
    for t in (11.0, 12.0, 13.0):
        assert watch.on_wake(t, running) == ()
    watch.close()
    assert [s.partition(", a GPU error")[0] for s in said] == ["ddpboot: gpu watch: GPU 0 (rank 0) reported Xid 13",
                                                              "ddpboot: gpu watch: GPU 0 (rank 0) reported Xid 79"]
    assert "marked failing" not in said[0]
    assert said[1].endswith("; GPU 0 is marked failing for the later jobs of this machine, whose automatic choice "
                            "leaves it out (`ddpboot gpus` shows why, `ddpboot gpus --clear 0` clears the mark)")
    marks = failing(["GPU-a", "GPU-b"], lockdir)
    assert list(marks) == ["GPU-a"] and (marks["GPU-a"].run_id, marks["GPU-a"].label) == ("job-9", "0")


def test_a_mark_the_directory_refuses_is_said_and_the_job_goes_on(tmp_path: Path) -> None:
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps([{"index": 0, "uuid": "GPU-a", "xids": [79]}]))
    said: list[str] = []
    env = {"DDPBOOT_FAKE_GPUS": str(inventory), "DDPBOOT_LOCK_DIR": str(tmp_path / "none")}
    watch = GpuWatch.start(job(tmp_path, Clock(10.0), said, (slot(0, (gpu(0),)),), env=env, gpu_watch_interval=1.0))
    assert watch is not None and watch.on_wake(11.0, Attempt([worker(0, os.getpid(), (gpu(0),))])) == ()
    watch.close()
    assert said[0].endswith(f"; it could not be marked failing for later jobs (the GPU lock directory "
                            f"{tmp_path / 'none'} refused)")
