"""The status file `ddpboot top` reads: written when something changed and at most once a second, whole, with the
ranks' pids, GPUs, exit codes, last output and progress bars, and the GPU watch's warnings. A fake clock paces it;
the file is real."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ddpboot.launch.observe.status import VERSION, WRITE_INTERVAL, GpuRef, RunStatus, StatusFile, read_status
from ddpboot.launch.rundir import RunPaths
from ddpboot.selection.gpu import GPU
from tests.unit.launch.observe.jobs import Clock, worker

EXITED_3 = 3 << 8  # the wait status of exit(3)


def status(tmp_path: Path, clock: Clock) -> RunStatus:
    st = RunStatus(tmp_path, "job-7", 0, 2, clock=clock, wall=lambda: 1000.0 + clock.now)
    st.begin(0)
    return st


def test_the_first_wake_up_writes_every_rank_with_its_pid_and_gpus(tmp_path: Path) -> None:
    clock = Clock()
    st = status(tmp_path, clock)
    assert st.due(clock.now) == -float("inf")  # the loop wakes at once for the first write, however quiet the ranks are
    gpu = GPU(index=3, uuid="GPU-3", pci_bus_id="", name="", memory_total=0, memory_used=0)
    st.update([worker(0, 4242, (gpu,)), worker(1, 4243)])
    data = read_status(tmp_path)
    assert data is not None
    assert (data.pid, data.run_id, data.world_size, data.attempt) == (os.getpid(), "job-7", 2, 0)
    assert [(r.rank, r.pid, r.code, r.last_output) for r in data.ranks] == [(0, 4242, None, None),
                                                                          (1, 4243, None, None)]
    assert data.ranks[0].gpus == (GpuRef("3", "GPU-3"),)
    assert data.ranks[0].started == 1099.0  # wall time of the start, from the loop's clock
    assert st.due(clock.now) is None


def test_a_change_within_the_interval_waits_for_it_and_nothing_new_writes_nothing(tmp_path: Path) -> None:
    clock = Clock()
    st = status(tmp_path, clock)
    workers = [worker(0, 10), worker(1, 11)]
    st.update(workers)
    clock.now += 0.25
    st.on_output(1, b"epoch 1:  40%|####      | 4/10\r")
    workers[1].err.bar = b"epoch 1:  40%|####      | 4/10\r"
    st.update(workers)
    assert st.writes == 1  # held back: the last write was 0.25 s ago
    assert st.due(clock.now) == clock.now + WRITE_INTERVAL - 0.25
    clock.now += WRITE_INTERVAL
    st.update(workers)
    data = read_status(tmp_path)
    assert st.writes == 2 and data is not None
    assert data.ranks[1].last_output == 1100.25 and data.ranks[1].bar == "epoch 1:  40%|####      | 4/10"
    for _ in range(5):  # nothing changed: no write, however often the loop wakes
        clock.now += 2 * WRITE_INTERVAL
        st.update(workers)
    assert st.writes == 2 and st.due(clock.now) is None


def test_an_exit_is_published_with_its_code_and_the_last_bar_stays(tmp_path: Path) -> None:
    clock = Clock()
    st = status(tmp_path, clock)
    workers = [worker(0, 10), worker(1, 11)]
    workers[0].out.bar = b"step 9/9"
    st.update(workers)
    workers[0].out.bar = None  # the bar ended with a newline
    workers[0].status = EXITED_3
    st.on_exit(workers[0])
    clock.now += WRITE_INTERVAL
    st.update(workers)
    data = read_status(tmp_path)
    assert data is not None
    assert data.ranks[0].code == 3 and data.ranks[0].bar == "step 9/9"
    assert data.ranks[1].code is None


def test_warnings_are_kept_in_order(tmp_path: Path) -> None:
    clock = Clock()
    st = status(tmp_path, clock)
    st.warn("ddpboot: gpu watch: pid 7 is not this job's")
    st.warn("ddpboot: gpu watch: GPU 0 is 97% full")
    st.update([worker(0, 10)])
    data = read_status(tmp_path)
    assert data is not None and data.warnings == ("ddpboot: gpu watch: pid 7 is not this job's",
                                                  "ddpboot: gpu watch: GPU 0 is 97% full")


def test_the_file_is_whole_and_removed_at_the_end_and_a_foreign_one_is_not_read(tmp_path: Path) -> None:
    clock = Clock()
    st = status(tmp_path, clock)
    st.update([worker(0, 10)])
    assert [p.name for p in tmp_path.iterdir()] == [RunPaths.STATUS]  # no partial file left beside it
    st.remove()
    assert read_status(tmp_path) is None
    (tmp_path / RunPaths.STATUS).write_text(json.dumps({"version": 99}))
    assert read_status(tmp_path) is None
    (tmp_path / RunPaths.STATUS).write_text("{cut")
    assert read_status(tmp_path) is None


def test_a_run_directory_that_cannot_be_written_stops_the_writes_not_the_job(tmp_path: Path) -> None:
    clock = Clock()
    st = RunStatus(tmp_path / "gone", "job", 0, 1, clock=clock)
    st.begin(0)
    st.update([worker(0, 10)])
    assert st.broken and st.writes == 0
    st.begin(1)  # a restart: still nothing to wait for, the loop must not spin
    assert st.due(clock.now) is None
    st.update([worker(0, 10)])  # no second try
    assert st.writes == 0


def test_a_write_costs_well_under_a_millisecond_per_rank(tmp_path: Path) -> None:
    """The status's cost, measured: 64 ranks with bars, written 200 times; and the per-wake-up check alone."""
    clock = Clock()
    st = status(tmp_path, clock)
    workers = [worker(r, 1000 + r) for r in range(64)]
    for w in workers:
        w.err.bar = b"epoch 3:  57%|#####7    | 570/1000 [01:02<00:47,  9.12it/s]"
    start = time.perf_counter()
    for _ in range(200):
        st.on_output(0, b"step\n")
        clock.now += WRITE_INTERVAL
        st.update(workers)
    per_write = (time.perf_counter() - start) / 200
    start = time.perf_counter()
    for _ in range(10000):
        st.on_output(0, b"step\n")
        st.update(workers)  # within the interval: the check only
    per_check = (time.perf_counter() - start) / 10000
    assert st.writes == 200
    print(f"status write, 64 ranks: {per_write * 1e3:.3f} ms; check: {per_check * 1e6:.1f} us")
    assert per_write < 0.064, per_write  # < 1 ms per rank, even on a loaded 2-core machine
    assert per_check < 0.001, per_check


def test_the_file_is_one_record_written_and_read_back_field_for_field(tmp_path: Path) -> None:
    """The JSON object's keys are the records' fields, in their order; what is written reads back equal."""
    clock = Clock()
    st = status(tmp_path, clock)
    gpu = GPU(index=3, uuid="GPU-3", pci_bus_id="", name="", memory_total=0, memory_used=0)
    workers = [worker(0, 4242, (gpu,)), worker(1, 4243)]
    workers[1].err.bar = b"step 2/9"
    st.warn("ddpboot: gpu watch: a warning")
    st.update(workers)
    raw = json.loads(RunPaths(tmp_path).status.read_text())
    assert list(raw) == ["version", "pid", "start", "run_id", "node_rank", "host", "attempt", "world_size", "updated",
                         "ranks", "warnings"]
    assert list(raw["ranks"][0]) == ["rank", "local_rank", "pid", "start", "gpus", "started", "code", "last_output",
                                     "bar", "cause", "phases", "phase", "straggler"]
    assert raw["version"] == VERSION and raw["ranks"][0]["gpus"] == [{"label": "3", "uuid": "GPU-3"}]
    back = StatusFile.from_json(raw)
    assert back == read_status(tmp_path) and back is not None and back.to_json() == raw
    assert StatusFile.from_json({**raw, "ranks": [{"rank": 0}]}) is None  # damaged: not read
    assert StatusFile.from_json([]) is None
