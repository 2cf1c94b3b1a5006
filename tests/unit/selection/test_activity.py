"""A running job's GPUs as the simulated inventory describes them: processes and health, read again at each call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpboot.errors import InventoryError
from ddpboot.selection.activity import GpuHealth, GpuProcess, fake_gpu_health, fake_gpu_processes
from ddpboot.selection.inventory import fake_uuid


def test_processes_and_health_come_from_the_file_as_it_is_now(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"index": 0, "processes": [7, {"pid": 8, "used_memory": 1 << 20}]}, {"index": 1}]))
    assert fake_gpu_processes(str(path)) == [GpuProcess(fake_uuid(0), "0", 7, None),
                                             GpuProcess(fake_uuid(0), "0", 8, 1 << 20)]
    path.write_text(json.dumps({"gpus": [{"index": 0, "memory_total": 100, "memory_used": 99,
                                          "slowdowns": ["hw_thermal", "power_brake"], "ecc_uncorrected": 2,
                                          "xids": [48]}]}))
    assert fake_gpu_processes(str(path)) == []
    assert fake_gpu_health(str(path)) == [GpuHealth(fake_uuid(0), "0", 100, 99,
                                                    ("thermal slowdown (hardware)", "power brake"), 2, (48,))]
    assert fake_gpu_health("8") == [] and fake_gpu_processes("8") == []


@pytest.mark.parametrize(("gpus", "message"), [
    ([{"index": 0, "slowdowns": ["hot"]}], r"unknown slowdowns \['hot'\]; known: \['hw_slowdown'"),
    ([{"index": 0, "processes": [{"pid": -1}]}], r"'processes' must list non-negative pids"),
    ([{"index": 0, "processes": [{"pid": 1, "memory": 2}]}], r"'processes' must list"),
])
def test_a_bad_simulated_reading_is_explained(tmp_path: Path, gpus: list[object], message: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(gpus))
    with pytest.raises(InventoryError, match=message):
        fake_gpu_health(str(path)) if "slowdowns" in gpus[0] else fake_gpu_processes(str(path))  # type: ignore[index,operator]
