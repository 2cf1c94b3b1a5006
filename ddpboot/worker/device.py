"""Which device this rank computes on, chosen before the process group starts (so NCCL and every later `.cuda()`
land on it), and the guards that only CUDA can answer."""

from __future__ import annotations

import os

import torch

from ddpboot.cluster import ClusterEnvironment
from ddpboot.errors import CudaInitializedEarlyError, UnassignedGpuError, WorkerEnvError
from ddpboot.selection.visible import parse_visible_devices
from ddpboot.worker.guards import any_mig, pitfall, unassigned_gpus


def cuda_uuid(index: int) -> str:
    """The NVML spelling (`GPU-...`) of a visible device's UUID; torch prints the bare hex groups."""
    text = str(torch.cuda.get_device_properties(index).uuid)
    return text if text.upper().startswith(("GPU-", "MIG-")) else "GPU-" + text


def cuda_initialized() -> bool:
    """torch.cuda.is_initialized, typed (torch leaves it unannotated)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def select_device_index(index: int, visible_count: int, variable: str) -> int:
    """Which of the visible GPUs this rank uses: the only one, or the `index`-th (LOCAL_RANK's meaning)."""
    if visible_count == 1:
        return 0
    if 0 <= index < visible_count:
        return index
    raise WorkerEnvError(
        f"{variable}={index} but this process sees only {visible_count} GPUs (cuda:0..cuda:{visible_count - 1}), so "
        "it has no GPU of its own. Fix: start at most one process per visible GPU, or let ddpboot give each rank "
        "its own GPU (rank isolation)."
    )


def choose_device(env: ClusterEnvironment, strict: bool) -> tuple[torch.device, tuple[str, ...]]:
    """This rank's device, made current (`torch.cuda.set_device`), and the UUIDs of its GPUs (empty on CPU)."""
    if env.narrows_visible_devices:
        hint, early_reported = _narrow_visible_devices(env, strict)
    else:
        hint, early_reported = env.device_index, False
    count = torch.cuda.device_count()
    if count == 0:  # a simulated inventory (DDPBOOT_FAKE_GPUS) plans GPUs for ranks that run on CPU
        return torch.device("cpu"), env.assigned_gpus
    index = select_device_index(hint, count, env.local_rank_var)
    if cuda_initialized() and not early_reported:
        _check_current_device(index, strict)
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    _check_unassigned_gpus(env, count, strict)
    return device, env.assigned_gpus or (cuda_uuid(index),)


def _narrow_visible_devices(env: ClusterEnvironment, strict: bool) -> tuple[int, bool]:
    """Give the process only its own GPU; return (index of its GPU among the visible ones, early-init reported)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(raw)
    # Counting from the variable itself keeps CUDA untouched; only an unset variable needs torch (which asks NVML).
    count = len(entries) if entries is not None else torch.cuda.device_count()
    if count <= 1:
        return 0, False
    narrowed = env.own_visible_devices(entries, count)
    if narrowed is None:
        return 0, False
    if cuda_initialized():
        pitfall(
            strict,
            CudaInitializedEarlyError,
            f"CUDA was initialised before ddpboot.init(), so this {env.task_noun} keeps seeing all {count} GPUs of "
            f"the node instead of only its own (cuda:{env.local_rank}); CUDA calls made so far ran on cuda:0. "
            "Fix: call ddpboot.init() before any CUDA call.",
        )
        return env.local_rank, True
    # An index in CUDA_VISIBLE_DEVICES then means the GPU nvidia-smi shows under it.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ["CUDA_VISIBLE_DEVICES"] = narrowed
    return 0, False


def _check_current_device(index: int, strict: bool) -> None:
    """The guard for CUDA initialised before init() on a GPU other than this rank's `cuda:index`."""
    current = torch.cuda.current_device()
    if current != index:
        pitfall(
            strict,
            CudaInitializedEarlyError,
            f"CUDA was initialised on cuda:{current} before ddpboot.init(), but this rank's GPU is "
            f"cuda:{index}: tensors made so far, and a CUDA context of several hundred MiB, sit on another "
            "rank's GPU. Fix: call ddpboot.init() before creating any CUDA tensor or model.",
        )


def _check_unassigned_gpus(env: ClusterEnvironment, count: int, strict: bool) -> None:
    """Under rank isolation, the guard for visible GPUs the launcher did not assign to this rank."""
    assigned = env.assigned_gpus
    # MIG instances: torch reports no MIG-... UUID to compare with, so the check is left out.
    if env.isolation is None or not env.isolation.own_gpus_only or not assigned or any_mig(assigned):
        return
    extra = unassigned_gpus([cuda_uuid(i) for i in range(count)], assigned)
    if extra:
        pitfall(
            strict,
            UnassignedGpuError,
            f"CUDA shows this rank {count} GPUs, including {', '.join(extra)}, which the ddpboot launcher "
            f"did not assign to it (DDPBOOT_GPU_UUIDS={','.join(assigned)}): it may compete with other "
            "ranks for them. Fix: leave CUDA_VISIBLE_DEVICES as the launcher set it.",
        )
