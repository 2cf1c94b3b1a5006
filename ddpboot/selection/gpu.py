"""A GPU and the machine's list of them: plain records, whoever read them (selection/inventory.py reads them
through NVML or simulates them). The worker may import this module; nothing here reads the machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpboot.units import plural


@dataclass(frozen=True)
class GPU:
    """One schedulable device: a whole GPU, or one MIG instance of a GPU (`mig_index` set).

    `index` is the NVML index (PCI order, what nvidia-smi shows); a MIG instance carries its parent's
    index and bus id.
    """

    index: int
    uuid: str
    pci_bus_id: str
    name: str
    memory_total: int
    memory_used: int
    utilization: int | None = None
    processes: tuple[int, ...] = ()
    cpu_affinity: tuple[int, ...] = ()
    numa_node: int | None = None
    mig_index: int | None = None
    mig_devices: tuple[GPU, ...] = field(default=(), repr=False)

    @property
    def label(self) -> str:
        """How a person names it: `3`, or `3:1` for MIG instance 1 of GPU 3."""
        return str(self.index) if self.mig_index is None else f"{self.index}:{self.mig_index}"

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_devices)

    @property
    def memory_free(self) -> int:
        return max(self.memory_total - self.memory_used, 0)

    def units(self) -> tuple[GPU, ...]:
        """What ranks can be given of it: its MIG instances when MIG is enabled, else the whole GPU."""
        return self.mig_devices if self.mig_enabled else (self,)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
            "memory_total": self.memory_total,
            "memory_used": self.memory_used,
        }
        if self.mig_index is not None:
            out["mig_index"] = self.mig_index
        return out


@dataclass(frozen=True)
class Inventory:
    """Every GPU of the machine in PCI order, and how they were found."""

    gpus: tuple[GPU, ...]
    source: str  # "nvml", "fake" or "none"
    notes: tuple[str, ...] = ()

    def units(self) -> tuple[GPU, ...]:
        """What ranks can be given: whole GPUs, and the MIG instances of MIG-enabled GPUs."""
        return tuple(unit for gpu in self.gpus for unit in gpu.units())

    def describe(self) -> str:
        """`this machine has 8 GPUs: 0, 1, ...`, for messages that must say what there is to choose from."""
        if not self.gpus:
            return "this machine has no GPUs"
        return f"this machine has {plural(len(self.gpus), 'GPU')}: {', '.join(g.label for g in self.gpus)}"
