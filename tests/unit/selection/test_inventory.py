"""The inventory: simulated GPUs (DDPBOOT_FAKE_GPUS) and NVML's answers, failures included."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ddpboot.errors import InventoryError
from ddpboot.selection.inventory import fake_inventory, fake_uuid, load_inventory, nvml_inventory


def test_count_gives_idle_80gib_gpus_with_stable_distinct_uuids() -> None:
    inv = fake_inventory("8")
    assert inv.source == "fake" and len(inv.gpus) == 8
    assert [g.index for g in inv.gpus] == list(range(8))
    assert len({g.uuid for g in inv.gpus}) == 8
    assert len({g.uuid[:8] for g in inv.gpus}) == 8  # short prefixes already tell them apart
    assert all(g.memory_total == 80 * 2**30 and g.memory_used == 0 and g.utilization == 0 for g in inv.gpus)
    assert fake_inventory("8").gpus == inv.gpus  # stable across calls
    assert fake_uuid(3) == inv.gpus[3].uuid


def test_zero_is_an_empty_machine() -> None:
    assert fake_inventory("0").gpus == ()


def test_load_inventory_prefers_the_simulation() -> None:
    assert load_inventory({"DDPBOOT_FAKE_GPUS": "3"}).source == "fake"


def test_json_inventory(fake_gpus: Any) -> None:
    path = fake_gpus(
        [
            {"name": "H200", "memory_total": 100, "memory_used": 60, "utilization": 90, "processes": [4242]},
            {"uuid": "GPU-1234", "pci_bus_id": "00000000:9A:00.0", "cpu_affinity": [0, 1], "numa_node": 1},
        ]
    )
    inv = fake_inventory(path)
    a, b = inv.gpus
    assert (a.name, a.memory_used, a.utilization, a.processes) == ("H200", 60, 90, (4242,))
    assert (b.uuid, b.pci_bus_id, b.cpu_affinity, b.numa_node) == ("GPU-1234", "00000000:9A:00.0", (0, 1), 1)


def test_json_accepts_gpus_command_output(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"gpus": [{"index": 0, "busy": True, "visible": True, "locked": False}]}))
    assert len(fake_inventory(str(path)).gpus) == 1


def test_json_mig(fake_gpus: Any) -> None:
    path = fake_gpus([{"mig_devices": [{"memory_total": 10}, {"memory_total": 20, "uuid": "MIG-abc"}]}])
    inv = fake_inventory(path)
    assert [u.label for u in inv.units()] == ["0:0", "0:1"]
    assert inv.units()[1].uuid == "MIG-abc"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("not json", "cannot read"),
        ('{"a": 1}', "JSON list"),
        ("[1]", "must be a JSON object"),
        ('[{"index": 1}]', "PCI order"),
        ('[{"memory_used": 5, "memory_total": 4}]', "memory_used"),
        ('[{"utilization": 101}]', "percentage"),
        ('[{"colour": "red"}]', "unknown keys"),
        ('[{"memory_total": "80GB"}]', "must be an integer"),
        ('[{"uuid": "abc"}]', "must start with"),
        ('[{"uuid": "GPU-1"}, {"uuid": "GPU-1"}]', "share UUID"),
        ('[{"processes": [-1]}]', "non-negative"),
    ],
)
def test_malformed_json_is_explained(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(content)
    with pytest.raises(InventoryError, match=match):
        fake_inventory(str(path))


@pytest.mark.parametrize("spec", ["eight", "-1", "/no/such/file.json", "99999"])
def test_malformed_spec_is_explained(spec: str) -> None:
    with pytest.raises(InventoryError, match="DDPBOOT_FAKE_GPUS"):
        fake_inventory(spec)


# --- NVML through a stand-in module: the inventory's handling of NVML's answers -------------------------


class NVMLError(Exception):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


def stub_nvml(monkeypatch: pytest.MonkeyPatch, *, init_fails: bool = False, broken: tuple[int, ...] = ()) -> None:
    mod: Any = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.nvmlMemory_v2 = 2
    mod.NVML_DEVICE_MIG_ENABLE = 1
    mod.shutdowns = 0

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def handle(i: int) -> int:
        if i in broken:
            raise NVMLError_NoPermission("Insufficient Permissions")
        return i

    def memory(h: int, version: int = 1) -> Any:
        used = 0 if version == 2 else 615 * 2**20  # v1 counts the driver's reserved memory as used
        return types.SimpleNamespace(total=141 * 2**30, used=used)

    def util(h: int) -> Any:
        if h == 1:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=7)

    def affinity(h: int, n: int) -> list[int]:
        return [0b1010] + [0] * (n - 1)

    def shutdown() -> None:
        mod.shutdowns += 1

    mod.nvmlInit = init
    mod.nvmlShutdown = shutdown
    mod.nvmlDeviceGetCount = lambda: 3
    mod.nvmlDeviceGetHandleByIndex = handle
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h}{h}{h}{h}-uuid"
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0".encode())
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    mod.nvmlDeviceGetMemoryInfo = memory
    mod.nvmlDeviceGetUtilizationRates = util
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=99)] if h == 2 else []
    mod.nvmlDeviceGetCpuAffinity = affinity
    mod.nvmlDeviceGetMigMode = lambda h: (0, 0)
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def test_nvml_reads_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_nvml(monkeypatch)
    inv = nvml_inventory()
    assert inv.source == "nvml" and [g.index for g in inv.gpus] == [0, 1, 2]
    g0, g1, g2 = inv.gpus
    assert g0.uuid == "GPU-0000-uuid" and g0.pci_bus_id == "00000000:18:00.0" and g0.name == "NVIDIA H200"
    assert g0.memory_used == 0  # v2: reserved memory is not "used"
    assert g0.utilization == 7 and g1.utilization is None  # an unsupported query is unknown, not a failure
    assert g0.cpu_affinity == (1, 3)
    assert g2.processes == (99,)
    assert sys.modules["pynvml"].shutdowns == 1  # type: ignore[attr-defined]


def test_nvml_skips_a_gpu_it_cannot_read_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_nvml(monkeypatch, broken=(1,))
    inv = nvml_inventory()
    assert [g.index for g in inv.gpus] == [0, 2]
    assert inv.notes and "GPU 1" in inv.notes[0] and "skipped" in inv.notes[0]


def test_no_driver_is_an_empty_inventory_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_nvml(monkeypatch, init_fails=True)
    inv = nvml_inventory()
    assert inv.gpus == () and inv.source == "none"
    assert "no NVIDIA driver" in inv.notes[0]


def test_this_machine_without_a_driver_gives_an_empty_inventory() -> None:
    pytest.importorskip("pynvml")
    inv = nvml_inventory()
    if inv.source == "nvml":
        pytest.skip("this machine has an NVIDIA driver; the no-driver path is covered by the stand-in above")
    assert inv.gpus == () and inv.notes
