"""The machine's GPUs: read through NVML, or simulated with DDPBOOT_FAKE_GPUS.

Nothing here imports torch or initialises CUDA: NVML lists every GPU of the machine whatever
CUDA_VISIBLE_DEVICES says (which GPUs this process may use is selection/visible.py's business).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid as uuidlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ddpboot.contract import FAKE_GPUS_VAR
from ddpboot.errors import InventoryError
from ddpboot.selection.gpu import GPU, Inventory

GIB = 1024**3
_FAKE_MEMORY = 80 * GIB
_FAKE_NAME = "Simulated GPU 80GB"
_MAX_FAKE = 1024



def load_inventory(env: Mapping[str, str] | None = None) -> Inventory:
    """The simulated inventory when DDPBOOT_FAKE_GPUS is set, else NVML's."""
    env = os.environ if env is None else env
    spec = env.get(FAKE_GPUS_VAR)
    if spec is not None and spec.strip() != "":
        return fake_inventory(spec)
    return nvml_inventory()


# --- simulated inventory ---------------------------------------------------------------------------


def fake_uuid(index: int) -> str:
    """A stable, distinct UUID for simulated GPU `index` (distinct from its first characters on)."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"ddpboot-fake-gpu-{index}"))


def fake_bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0" if index < 14 else f"00000001:{index:02X}:00.0"


def fake_inventory(spec: str) -> Inventory:
    """`8` (eight idle 80 GiB GPUs) or a path to a JSON list of GPU objects in PCI order."""
    text = spec.strip()
    if text.isdigit():
        count = int(text)
        if count > _MAX_FAKE:
            raise InventoryError(
                f"{FAKE_GPUS_VAR}={spec} asks for {count} simulated GPUs; at most {_MAX_FAKE} are supported."
            )
        gpus = tuple(GPU(i, fake_uuid(i), fake_bus_id(i), _FAKE_NAME, _FAKE_MEMORY, 0, 0) for i in range(count))
        return Inventory(gpus, "fake", (f"simulated inventory: {count} idle GPUs ({FAKE_GPUS_VAR}={spec})",))
    path = Path(text)
    if not path.is_file():
        raise InventoryError(
            f"{FAKE_GPUS_VAR}={spec!r} is neither a GPU count nor a readable JSON file. "
            f"Set it to a number (e.g. {FAKE_GPUS_VAR}=8) or to the path of a JSON list of GPU objects "
            '(the format of `ddpboot gpus --json`\'s "gpus").'
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InventoryError(f"{FAKE_GPUS_VAR}: cannot read {path} as JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("gpus"), list):
        data = data["gpus"]  # accept `ddpboot gpus --json` output as it is
    if not isinstance(data, list):
        raise InventoryError(
            f"{FAKE_GPUS_VAR}: {path} must hold a JSON list of GPU objects, not {type(data).__name__}."
        )
    gpus = tuple(_fake_gpu(obj, i, path) for i, obj in enumerate(data))
    seen: dict[str, int] = {}
    for gpu in gpus:
        for unit in (gpu, *gpu.mig_devices):
            if unit.uuid in seen:
                raise InventoryError(
                    f"{FAKE_GPUS_VAR}: {path}: GPUs {seen[unit.uuid]} and {unit.label} share UUID {unit.uuid}."
                )
            seen[unit.uuid] = unit.index
    return Inventory(gpus, "fake", (f"simulated inventory: {len(gpus)} GPUs from {path}",))


# Keys a simulated GPU may have: GPU's fields, and the derived states `ddpboot gpus --json` adds (ignored here), so
# that its output can be fed back as it is.
_FAKE_KEYS = frozenset(
    {"index", "uuid", "pci_bus_id", "name", "memory_total", "memory_used", "utilization", "processes"}
    | {"cpu_affinity", "numa_node", "mig_devices", "mig_index"}
    | {"visible", "busy", "locked", "memory_free", "excluded"}
    | {"slowdowns", "ecc_uncorrected", "xids"}  # the health the watch reads (fake_gpu_health)
)


class _FakeRecord:
    """One GPU object of a simulated inventory, read field by field; every error names where the bad value is."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise InventoryError(f"{where} must be a JSON object, not {obj!r}.")
        unknown = sorted(set(obj) - _FAKE_KEYS)
        if unknown:
            raise InventoryError(f"{where} has unknown keys {unknown}; known keys: {sorted(_FAKE_KEYS)}.")
        self.obj: dict[str, Any] = obj
        self.where = where

    def get(self, key: str, kind: type, default: Any) -> Any:
        value = self.obj.get(key, default)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InventoryError(f"{self.where}: {key!r} must be {_kind_name(kind)}, not {value!r}.")
        return value

    def memory(self) -> tuple[int, int]:
        total, used = self.get("memory_total", int, _FAKE_MEMORY), self.get("memory_used", int, 0)
        if total < 0 or used < 0 or used > total:
            raise InventoryError(f"{self.where}: memory_used {used} must lie between 0 and memory_total {total}.")
        return total, used

    def utilization(self) -> int | None:
        value: int | None = self.get("utilization", int, 0)
        if value is not None and not 0 <= value <= 100:
            raise InventoryError(f"{self.where}: utilization must be a percentage 0-100, not {value}.")
        return value

    def processes(self) -> tuple[tuple[int, int | None], ...]:
        """(pid, bytes of GPU memory or None) of each entry of "processes": a pid, or {"pid": N, "used_memory": B}."""
        out: list[tuple[int, int | None]] = []
        for v in self.get("processes", list, []):
            pid: Any
            used: Any
            if isinstance(v, dict) and set(v) <= {"pid", "used_memory"}:
                pid, used = v.get("pid"), v.get("used_memory")
            else:
                pid, used = v, None
            if not _count(pid) or not (used is None or _count(used)):
                raise InventoryError(f"{self.where}: 'processes' must list non-negative pids or objects "
                                     f'{{"pid": N, "used_memory": BYTES}}, not {v!r}.')
            out.append((pid, used))
        return tuple(out)

    def numbers(self, key: str) -> tuple[int, ...]:
        values = self.get(key, list, [])
        if not all(_count(v) for v in values):
            raise InventoryError(f"{self.where}: {key!r} must be a list of non-negative integers.")
        return tuple(values)

    def uuid(self, default: str, prefix: str) -> str:
        given: str | None = self.get("uuid", str, None)
        value = default if given is None else given
        if not value.startswith(prefix):
            raise InventoryError(f"{self.where}: uuid {value!r} must start with {prefix!r}.")
        return value


def _fake_gpu(obj: Any, position: int, path: Path) -> GPU:
    """A whole simulated GPU (and its MIG instances) from its JSON object at `position` in the list."""
    rec = _FakeRecord(obj, f"{FAKE_GPUS_VAR}: {path}: GPU {position}")
    index = rec.get("index", int, position)
    if index != position:
        raise InventoryError(
            f"{rec.where} says index {index}; GPUs must be listed in PCI order with indices 0, 1, 2, ..."
        )
    memory_total, memory_used = rec.memory()
    utilization = rec.utilization()
    processes, cpus = tuple(pid for pid, _ in rec.processes()), rec.numbers("cpu_affinity")
    gpu = GPU(
        index=index,
        uuid=rec.uuid(fake_uuid(index), "GPU-"),
        pci_bus_id=rec.get("pci_bus_id", str, fake_bus_id(index)),
        name=rec.get("name", str, _FAKE_NAME),
        memory_total=memory_total,
        memory_used=memory_used,
        utilization=utilization,
        processes=processes,
        cpu_affinity=cpus,
        numa_node=rec.get("numa_node", int, None),
    )
    migs = rec.get("mig_devices", list, [])
    if not migs:
        return gpu
    children = tuple(_fake_mig(m, j, path, gpu) for j, m in enumerate(migs))
    return GPU(**{**gpu.__dict__, "mig_devices": children})


def _fake_mig(obj: Any, position: int, path: Path, parent: GPU) -> GPU:
    """MIG instance `position` of a simulated GPU: its own memory, load and UUID; the rest is its parent's."""
    rec = _FakeRecord(obj, f"{FAKE_GPUS_VAR}: {path}: GPU {parent.index} MIG device {position}")
    memory_total, memory_used = rec.memory()
    utilization = rec.utilization()
    processes = rec.numbers("processes")
    rec.numbers("cpu_affinity")  # checked as for a whole GPU; an instance is as near the cores as its parent
    return GPU(
        index=parent.index,
        uuid=rec.uuid("MIG-" + fake_uuid(1000 * parent.index + position)[4:], "MIG-"),
        pci_bus_id=parent.pci_bus_id,
        name=rec.get("name", str, _FAKE_NAME),
        memory_total=memory_total,
        memory_used=memory_used,
        utilization=utilization,
        processes=processes,
        cpu_affinity=parent.cpu_affinity,
        numa_node=parent.numa_node,
        mig_index=position,
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind_name(kind: type) -> str:
    return {int: "an integer", str: "a string", list: "a list"}.get(kind, kind.__name__)


# --- NVML ------------------------------------------------------------------------------------------

T = TypeVar("T")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_inventory() -> Inventory:
    """Every GPU NVML can read. No driver or no NVML: an empty inventory and a note, never a traceback."""
    try:
        import pynvml
    except ImportError:
        return Inventory(
            (), "none", ("nvidia-ml-py is not installed, so no GPUs can be listed; planning for CPU ranks",)
        )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Inventory((), "none", (f"no NVIDIA driver found (NVML: {exc}); planning for CPU ranks",))
    except OSError as exc:  # a broken libnvidia-ml
        return Inventory((), "none", (f"NVML could not be loaded ({exc}); planning for CPU ranks",))
    notes: list[str] = []
    gpus: list[GPU] = []
    try:
        count = pynvml.nvmlDeviceGetCount()
        for i in range(count):
            try:
                gpus.append(_read_gpu(pynvml, i))
            except pynvml.NVMLError as exc:
                notes.append(f"GPU {i}: NVML could not read it ({exc}); skipped")
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return Inventory(tuple(gpus), "nvml", tuple(notes))


def _read_gpu(nv: Any, index: int) -> GPU:
    h = nv.nvmlDeviceGetHandleByIndex(index)

    def soft(fn: Callable[[], T], default: T) -> T:
        try:
            return fn()
        except nv.NVMLError:
            return default

    bus_id = _text(nv.nvmlDeviceGetPciInfo(h).busId)
    total, used = _memory(nv, h)
    mig_devices: tuple[GPU, ...] = ()
    parent = GPU(
        index=index,
        uuid=_text(nv.nvmlDeviceGetUUID(h)),
        pci_bus_id=bus_id,
        name=_text(nv.nvmlDeviceGetName(h)),
        memory_total=total,
        memory_used=used,
        utilization=soft(lambda: int(nv.nvmlDeviceGetUtilizationRates(h).gpu), None),
        processes=soft(lambda: tuple(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)), ()),
        cpu_affinity=soft(lambda: _cpu_affinity(nv, h), ()),
        numa_node=_numa_node(bus_id),
    )
    current = soft(lambda: nv.nvmlDeviceGetMigMode(h)[0], 0)
    if current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
        mig_devices = _mig_devices(nv, h, parent)
    return GPU(**{**parent.__dict__, "mig_devices": mig_devices}) if mig_devices else parent


def _memory(nv: Any, h: Any) -> tuple[int, int]:
    """(total, used); v2 separates driver-reserved memory from what processes use."""
    try:
        info = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    except (AttributeError, TypeError, nv.NVMLError):
        info = nv.nvmlDeviceGetMemoryInfo(h)
    return int(info.total), int(info.used)


def _cpu_affinity(nv: Any, h: Any) -> tuple[int, ...]:
    ncpu = os.cpu_count() or 1
    words = (ncpu + 63) // 64
    masks = nv.nvmlDeviceGetCpuAffinity(h, words)
    return tuple(w * 64 + b for w, mask in enumerate(masks) for b in range(64) if int(mask) >> b & 1)


def _numa_node(bus_id: str) -> int | None:
    """The GPU's NUMA node from sysfs: NVML's NUMA query is unsupported on some x86 hosts, sysfs always answers."""
    try:
        domain, rest = bus_id.split(":", 1)
        path = Path(f"/sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}/numa_node")
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _mig_devices(nv: Any, h: Any, parent: GPU) -> tuple[GPU, ...]:
    out: list[GPU] = []
    try:
        count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except nv.NVMLError:
        return ()
    for j in range(count):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            total, used = _memory(nv, mh)
            out.append(
                GPU(
                    index=parent.index,
                    uuid=_text(nv.nvmlDeviceGetUUID(mh)),
                    pci_bus_id=parent.pci_bus_id,
                    name=f"{parent.name} MIG {total // GIB}g",
                    memory_total=total,
                    memory_used=used,
                    cpu_affinity=parent.cpu_affinity,
                    numa_node=parent.numa_node,
                    mig_index=len(out),
                )
            )
        except nv.NVMLError:
            continue  # NotFound: an empty slot
    return tuple(out)


# --- what the GPU readings of a running job (selection/activity.py) share with the inventory ------------------------


def fake_gpu(obj: Any, position: int, path: Path) -> GPU:
    """Simulated GPU `position` of `path`'s list, checked as the inventory checks it."""
    return _fake_gpu(obj, position, path)


def fake_processes(obj: Any, where: str) -> tuple[tuple[int, int | None], ...]:
    """(pid, bytes or None) of a simulated GPU's "processes"."""
    return _FakeRecord(obj, where).processes()


def nvml_text(value: str | bytes) -> str:
    return _text(value)


def nvml_memory(nv: Any, h: Any) -> tuple[int, int]:
    """(total, used) of a GPU, as the inventory reads it."""
    return _memory(nv, h)
