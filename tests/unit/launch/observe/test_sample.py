"""`ddpboot top`'s readings: each rank's state as far as it can be known from outside, CPU % between two looks, the
rank's GPU memory, the seconds since its output, its bar; the JSON snapshot; this process and the simulated
inventory's process lists read."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddpboot.launch.observe.sample import GpuReadings, GpuSampler, ProcReading, build_rows, read_process, snapshot_json
from ddpboot.launch.observe.status import GpuRef
from ddpboot.procfs import read_stat
from tests.unit.launch.observe.statuses import BAR, BEFORE, GPUS, NOW, rank, status


def test_each_rank_gets_its_state_cpu_memory_gpu_and_quiet_time() -> None:
    rows = build_rows(status(), BEFORE, NOW, 2.0, GPUS, 1000.0)
    assert [r.state for r in rows] == ["running", "stopped", "exited 3", "starting"]
    assert rows[0].cpu == 75.0 and rows[0].rss == 2 << 30 and rows[0].quiet == 10.0 and rows[0].bar == BAR
    assert rows[1].cpu == 0.0 and rows[1].quiet is None
    assert [(g.label, g.used, g.utilization) for g in rows[0].gpus] == [("0", 3 << 30, 93)]
    assert rows[1].gpus[0].used == 0  # read, and no process of rank 1 holds memory there
    assert rows[2].cpu is None and rows[2].rss is None  # exited: its pid may be another process's now
    assert {r.node for r in rows} == {1}


def test_a_rank_gone_before_the_launcher_reaped_it_is_exited_and_unknown_readings_stay_unknown() -> None:
    rows = build_rows(status(), {}, {100: ProcReading(1.0, 1, "Z")}, 1.0, GpuReadings(), 1000.0)
    assert rows[0].state == "exited" and rows[0].cpu is None
    assert rows[1].state == "exited"  # no reading: gone
    assert rows[0].gpus[0].used is None and rows[0].gpus[0].utilization is None


def test_the_json_snapshot_names_the_job_and_every_field_of_a_row() -> None:
    rows = build_rows(status(), BEFORE, NOW, 2.0, GPUS, 1000.0)
    data = json.loads(json.dumps(snapshot_json(status(), rows, 1000.0)))
    assert (data["run_id"], data["launcher_pid"], data["node_rank"], data["attempt"], data["status_age"]) == (
        "job-7", 99, 1, 2, 0.5)
    first = data["ranks"][0]
    assert first == {"rank": 0, "local_rank": 0, "node": 1, "pid": 100, "state": "running", "cpu_percent": 75.0,
                     "rss": 2 << 30, "since_output": 10.0, "progress": BAR, "phase": None, "straggler": None,
                     "gpus": [{"label": "0", "uuid": "GPU-a", "used_memory": 3 << 30, "memory_used": 40 << 30,
                               "memory_total": 80 << 30, "utilization": 93}]}
    assert data["warnings"] == ["ddpboot: gpu watch: pid 7 is odd"]


def test_this_process_reads_as_running_with_memory() -> None:
    me = read_process(os.getpid())
    assert me is not None and me.state in ("R", "S") and me.rss > 1 << 20 and me.cpu > 0
    assert read_process(0) is None
    stat = read_stat(os.getpid())
    assert stat is not None and read_process(os.getpid(), stat.start + 1) is None  # not the process that started then


def test_the_simulated_inventory_gives_utilisation_and_the_ranks_processes_memory(tmp_path: Path) -> None:
    """This test process plays rank 0: the GPU's process list names it with 2 GiB; another pid on GPU 1 is not
    rank 1's (rank 1's pid is one that cannot exist)."""
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([
        {"index": 0, "uuid": "GPU-a", "memory_total": 80 << 30, "memory_used": 5 << 30, "utilization": 61,
         "processes": [{"pid": os.getpid(), "used_memory": 2 << 30}]},
        {"index": 1, "uuid": "GPU-b", "processes": [{"pid": 1, "used_memory": 1 << 30}]},
    ]))
    st = status((rank(0, os.getpid(), (GpuRef("0", "GPU-a"),)), rank(1, 1 << 22 + 1, (GpuRef("1", "GPU-b"),))))
    reader = GpuSampler({"DDPBOOT_FAKE_GPUS": str(path)})
    got = reader.read(st)
    reader.close()
    assert got.known and got.gpus["GPU-a"] == (5 << 30, 80 << 30, 61)
    assert got.held == {(0, "GPU-a"): 2 << 30}


def test_a_job_without_gpus_reads_no_gpu_and_a_broken_inventory_says_unknown(tmp_path: Path) -> None:
    assert not GpuSampler({}).read(status((rank(0, os.getpid()),))).known
    bad = GpuSampler({"DDPBOOT_FAKE_GPUS": str(tmp_path / "missing.json")})
    assert not bad.read(status((rank(0, os.getpid(), (GpuRef("0", "GPU-a"),)),))).known and bad.failed


def test_the_straggler_named_in_the_status_is_its_rows() -> None:
    st = status((rank(0, 100), rank(1, 101, straggler="96% vs 16%")))
    rows = build_rows(st, BEFORE, NOW, 2.0, GPUS, 1000.0)
    assert [r.straggler for r in rows] == [None, "96% vs 16%"]
    assert [r["straggler"] for r in snapshot_json(st, rows, 1000.0)["ranks"]] == [None, "96% vs 16%"]
