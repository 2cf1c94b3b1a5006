"""`ddpboot top`'s rows and screen, from a status as the launcher publishes it and readings of processes and GPUs:
each rank's state as far as it can be known from outside, CPU % between two looks, the rank's GPU memory, the
seconds since its output, its bar; the screen at 80 columns; the simulated inventory's process lists read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from ddpboot.cli.top import (
    GpuReader,
    GpuReadings,
    ProcReading,
    build_rows,
    compact_bar,
    read_process,
    render,
    snapshot_json,
)

BAR = "epoch 2:  57%|#####7    | 570/1000 [01:02<00:47,  9.12it/s]"


def status(**extra: Any) -> dict[str, Any]:
    ranks = [
        {"rank": 0, "local_rank": 0, "pid": 100, "gpus": [{"label": "0", "uuid": "GPU-a"}], "code": None,
         "last_output": 990.0, "bar": BAR},
        {"rank": 1, "local_rank": 1, "pid": 101, "gpus": [{"label": "1", "uuid": "GPU-b"}], "code": None,
         "last_output": None, "bar": None},
        {"rank": 2, "local_rank": 2, "pid": 102, "gpus": [], "code": 3, "last_output": 900.0, "bar": "done"},
        {"rank": 3, "local_rank": 3, "pid": 0, "gpus": [], "code": None, "last_output": None, "bar": None},
    ]
    return {"version": 1, "pid": 99, "run_id": "job-7", "node_rank": 1, "host": "node-a", "attempt": 2,
            "world_size": 8, "updated": 999.5, "ranks": ranks, "warnings": ["ddpboot: gpu watch: pid 7 is odd"],
            **extra}


BEFORE = {100: ProcReading(10.0, 1 << 30, "R"), 101: ProcReading(5.0, 1 << 20, "S")}
NOW = {100: ProcReading(11.5, 2 << 30, "R"), 101: ProcReading(5.0, 1 << 20, "T")}
GPUS = GpuReadings({"GPU-a": (40 << 30, 80 << 30, 93), "GPU-b": (1 << 30, 80 << 30, 0)},
                   {(0, "GPU-a"): 3 << 30}, known=True)


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
                     "rss": 2 << 30, "since_output": 10.0, "progress": BAR,
                     "gpus": [{"label": "0", "uuid": "GPU-a", "used_memory": 3 << 30, "memory_used": 40 << 30,
                               "memory_total": 80 << 30, "utilization": 93}]}
    assert data["warnings"] == ["ddpboot: gpu watch: pid 7 is odd"]


def test_a_bar_loses_its_drawn_part_first() -> None:
    assert compact_bar(BAR) == "epoch 2: 57% 570/1000 [01:02<00:47, 9.12it/s]"
    assert compact_bar("step 3 of 9") == "step 3 of 9"


def screen(st: dict[str, Any], width: int) -> list[str]:
    rows = build_rows(st, BEFORE, NOW, 2.0, GPUS, 1000.0)
    con = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 (closed with the console)
    con.print(render(st, rows, width, "q to leave"))
    return con.export_text().splitlines()


def test_the_screen_fits_80_columns_one_line_per_rank() -> None:
    lines = screen(status(), 80)
    assert max(len(ln) for ln in lines) <= 80, lines
    assert lines[0].startswith("run job-7 · launcher pid 99 · node 1 (node-a)")
    header = next(ln for ln in lines if ln.startswith("rank"))
    assert all(h in header for h in ("pid", "state", "CPU", "RSS", "GPU", "quiet", "progress")), header
    [rank0] = [ln for ln in lines if ln.startswith("0 ")]
    assert "running" in rank0 and "75%" in rank0 and "2.0G" in rank0 and "0 3.0G 93%" in rank0 and "10s" in rank0
    assert "epoch 2: 57%" in rank0
    assert any("exited 3" in ln for ln in lines) and any("starting" in ln for ln in lines)
    assert "ddpboot: gpu watch: pid 7 is odd" in lines and lines[-1] == "q to leave"


def test_a_narrow_screen_drops_columns_by_priority_never_rank_nor_state() -> None:
    wide = screen(status(), 140)
    narrow = screen(status(), 40)
    assert max(len(ln) for ln in narrow) <= 40, narrow
    assert "node" in next(ln for ln in wide if ln.startswith("rank"))
    header = next(ln for ln in narrow if ln.startswith("rank"))
    assert "state" in header and "progress" in header and "GPU" not in header and "node" not in header


def test_a_job_without_gpus_has_no_gpu_column() -> None:
    st = status()
    for entry in st["ranks"]:
        entry["gpus"] = []
    header = next(ln for ln in screen(st, 80) if ln.startswith("rank"))
    assert "GPU" not in header


def test_this_process_reads_as_running_with_memory() -> None:
    me = read_process(os.getpid())
    assert me is not None and me.state in ("R", "S") and me.rss > 1 << 20 and me.cpu > 0
    assert read_process(0) is None


def test_the_simulated_inventory_gives_utilisation_and_the_ranks_processes_memory(tmp_path: Path) -> None:
    """This test process plays rank 0: the GPU's process list names it with 2 GiB; another pid on GPU 1 is not
    rank 1's (rank 1's pid is one that cannot exist)."""
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([
        {"index": 0, "uuid": "GPU-a", "memory_total": 80 << 30, "memory_used": 5 << 30, "utilization": 61,
         "processes": [{"pid": os.getpid(), "used_memory": 2 << 30}]},
        {"index": 1, "uuid": "GPU-b", "processes": [{"pid": 1, "used_memory": 1 << 30}]},
    ]))
    st = {"ranks": [{"rank": 0, "pid": os.getpid(), "gpus": [{"label": "0", "uuid": "GPU-a"}]},
                    {"rank": 1, "pid": 1 << 22 + 1, "gpus": [{"label": "1", "uuid": "GPU-b"}]}]}
    reader = GpuReader({"DDPBOOT_FAKE_GPUS": str(path)})
    got = reader.read(st)
    reader.close()
    assert got.known and got.gpus["GPU-a"] == (5 << 30, 80 << 30, 61)
    assert got.held == {(0, "GPU-a"): 2 << 30}


def test_a_job_without_gpus_reads_no_gpu_and_a_broken_inventory_says_unknown(tmp_path: Path) -> None:
    assert not GpuReader({}).read({"ranks": [{"rank": 0, "pid": os.getpid(), "gpus": []}]}).known
    bad = GpuReader({"DDPBOOT_FAKE_GPUS": str(tmp_path / "missing.json")})
    st = {"ranks": [{"rank": 0, "pid": os.getpid(), "gpus": [{"label": "0", "uuid": "GPU-a"}]}]}
    assert not bad.read(st).known and bad.failed
