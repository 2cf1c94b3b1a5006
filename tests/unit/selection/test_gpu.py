"""GPU and Inventory: labels, units (MIG instances stand in for their GPU), free memory, descriptions, JSON."""

from __future__ import annotations

from ddpboot.selection.gpu import GPU, Inventory

PLAIN = GPU(1, "GPU-1111", "00000000:02:00.0", "A100", 80, 30)
PARENT = GPU(0, "GPU-0000", "00000000:01:00.0", "A100", 80, 0)
MIGS = tuple(GPU(0, f"MIG-{j}", PARENT.pci_bus_id, "A100 MIG", 40, 50, mig_index=j) for j in range(2))
MIG_PARENT = GPU(**{**PARENT.__dict__, "mig_devices": MIGS})


def test_labels() -> None:
    assert PLAIN.label == "1" and MIGS[1].label == "0:1"


def test_units() -> None:
    assert PLAIN.units() == (PLAIN,) and not PLAIN.mig_enabled
    assert MIG_PARENT.units() == MIGS and MIG_PARENT.mig_enabled
    assert Inventory((MIG_PARENT, PLAIN), "fake").units() == (*MIGS, PLAIN)


def test_memory_free_never_negative() -> None:
    assert PLAIN.memory_free == 50 and MIGS[0].memory_free == 0


def test_describe() -> None:
    assert Inventory((), "none").describe() == "this machine has no GPUs"
    assert Inventory((PLAIN,), "fake").describe() == "this machine has 1 GPU: 1"
    assert Inventory((MIG_PARENT, PLAIN), "fake").describe() == "this machine has 2 GPUs: 0, 1"


def test_json() -> None:
    assert PLAIN.to_json() == {
        "index": 1,
        "uuid": "GPU-1111",
        "pci_bus_id": "00000000:02:00.0",
        "name": "A100",
        "memory_total": 80,
        "memory_used": 30,
    }
    assert MIGS[1].to_json()["mig_index"] == 1
