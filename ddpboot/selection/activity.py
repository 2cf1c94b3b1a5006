"""What a running job's GPUs do, for `--gpu-watch` and `ddpboot top`: the compute processes on each GPU and each
GPU's health (memory, clock slowdowns, uncorrected ECC errors, Xid errors), from NVML (one session kept open between
readings) or from the simulated inventory (DDPBOOT_FAKE_GPUS as a JSON file, read again at every call so that a
test may rewrite it). Like the inventory, nothing here imports torch or initialises CUDA."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.contract import FAKE_GPUS_VAR
from ddpboot.errors import InventoryError
from ddpboot.selection.inventory import fake_gpu, fake_processes, nvml_memory, nvml_text


@dataclass(frozen=True)
class GpuHealth:
    """What the watch reads of a GPU's health: memory, the clock slowdowns in force now, the uncorrected ECC errors
    since the driver loaded (None: not reported), the Xid errors that came since the last reading."""

    uuid: str
    label: str
    memory_total: int
    memory_used: int
    slowdowns: tuple[str, ...] = ()
    ecc_uncorrected: int | None = None
    xids: tuple[int, ...] = ()


SLOWDOWNS = {  # NVML's clock event reasons that mean trouble (a power cap or an idle GPU is routine)
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "thermal slowdown (hardware)",
    "nvmlClocksEventReasonSwThermalSlowdown": "thermal slowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake",
}
FAKE_SLOWDOWNS = {"hw_slowdown": "hardware slowdown", "hw_thermal": "thermal slowdown (hardware)",
                  "sw_thermal": "thermal slowdown", "power_brake": "power brake"}


def fake_gpu_health(spec: str) -> list[GpuHealth]:
    """A simulated inventory's health: each GPU's memory, and optional "slowdowns" (FAKE_SLOWDOWNS' names),
    "ecc_uncorrected" and "xids" (reread at every call)."""
    if spec.strip().isdigit():
        return []
    out = []
    for i, obj in enumerate(_fake_list(spec)):
        gpu = fake_gpu(obj, i, Path(spec.strip()))
        names = obj.get("slowdowns", [])
        unknown = [n for n in names if n not in FAKE_SLOWDOWNS]
        if unknown:
            raise InventoryError(f"{FAKE_GPUS_VAR}: GPU {i}: unknown slowdowns {unknown}; known: "
                                 f"{sorted(FAKE_SLOWDOWNS)}")
        out.append(GpuHealth(gpu.uuid, gpu.label, gpu.memory_total, gpu.memory_used,
                             tuple(FAKE_SLOWDOWNS[n] for n in names), obj.get("ecc_uncorrected"),
                             tuple(obj.get("xids", []))))
    return out


def _fake_list(spec: str) -> list[Any]:
    path = Path(spec.strip())
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InventoryError(f"{FAKE_GPUS_VAR}: cannot read {path} as JSON: {exc}") from None
    if isinstance(data, dict):
        data = data.get("gpus", [])
    return data if isinstance(data, list) else []


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML sees on a GPU: its pid (in NVML's pid namespace) and memory (None: not reported)."""

    uuid: str
    label: str
    pid: int
    used: int | None


def fake_gpu_processes(spec: str) -> list[GpuProcess]:
    """The processes a simulated inventory lists (read again at every call: a test may rewrite the file)."""
    if spec.strip().isdigit():
        return []
    out = []
    for i, obj in enumerate(_fake_list(spec)):
        gpu = fake_gpu(obj, i, Path(spec.strip()))
        out += [GpuProcess(gpu.uuid, gpu.label, pid, used) for pid, used in fake_processes(obj, "")]
    return out


class NvmlProcesses:
    """NVML's compute processes of every GPU, through one NVML session kept open between readings (an init per
    reading would cost more than the reading). `read` raises NVMLError when NVML fails."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [(pynvml.nvmlDeviceGetHandleByIndex(i), i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.uuids = [nvml_text(pynvml.nvmlDeviceGetUUID(h)) for h, _ in self.handles]
        self.events: Any = None  # the Xid event set, made at the first health reading

    def read(self) -> list[GpuProcess]:
        out = []
        for (h, index), uuid in zip(self.handles, self.uuids, strict=True):
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h):
                used = getattr(p, "usedGpuMemory", None)
                out.append(GpuProcess(uuid, str(index), int(p.pid), int(used) if isinstance(used, int) else None))
        return out

    def health(self) -> list[GpuHealth]:
        """Each GPU's memory, slowdowns, uncorrected ECC count and the Xid errors since the last call; what a GPU
        cannot report is left out (NVMLError_NotSupported)."""
        nv = self.nv
        if self.events is None:
            self.events = self._xid_events()
        xids: dict[str, list[int]] = {}
        while self.events:
            try:
                data = nv.nvmlEventSetWait(self.events, 0)
                uuid = nvml_text(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                break  # a timeout: no more events
            xids.setdefault(uuid, []).append(int(data.eventData))
        out = []
        for (h, index), uuid in zip(self.handles, self.uuids, strict=True):
            total, used = nvml_memory(nv, h)
            reasons, ecc = self._reasons(h), self._ecc(h)
            slow = tuple(text for name, text in SLOWDOWNS.items() if reasons & int(getattr(nv, name, 0)))
            out.append(GpuHealth(uuid, str(index), total, used, slow, ecc, tuple(xids.get(uuid, ()))))
        return out

    def _reasons(self, h: Any) -> int:
        try:
            return int(self.nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        except self.nv.NVMLError:
            return 0

    def _ecc(self, h: Any) -> int | None:
        nv = self.nv
        try:
            return int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        except nv.NVMLError:
            return None

    def _xid_events(self) -> Any:
        """An event set registered for every GPU's critical Xid errors (False where NVML cannot give one)."""
        nv = self.nv
        try:
            events = nv.nvmlEventSetCreate()
            for h, _ in self.handles:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
            return events
        except nv.NVMLError:
            return False

    def close(self) -> None:
        with contextlib.suppress(self.nv.NVMLError):
            if self.events:
                self.nv.nvmlEventSetFree(self.events)
        with contextlib.suppress(self.nv.NVMLError):
            self.nv.nvmlShutdown()


class GpuReader:
    """A running job's GPU readings: from the simulated inventory when DDPBOOT_FAKE_GPUS is set (reread at every
    call), else from one NVML session opened at the first reading and kept until `close`."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.spec = (env.get(FAKE_GPUS_VAR) or "").strip()
        self.nvml: NvmlProcesses | None = None

    def _session(self) -> NvmlProcesses:
        if self.nvml is None:
            self.nvml = NvmlProcesses()
        return self.nvml

    def processes(self) -> list[GpuProcess]:
        return fake_gpu_processes(self.spec) if self.spec else self._session().read()

    def health(self) -> list[GpuHealth]:
        return fake_gpu_health(self.spec) if self.spec else self._session().health()

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None
