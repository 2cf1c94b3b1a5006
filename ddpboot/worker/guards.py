"""The pitfall guards: checks that warn with `DdpbootWarning` (or raise a `PitfallError` under strict=True) when
the job would run, but probably not on the GPUs meant. Each message says what happened and the one-line fix."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from ddpboot.cluster import ClusterEnvironment, split_uuids
from ddpboot.errors import PitfallError, VisibleDevicesChangedError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class DdpbootWarning(UserWarning):
    """A pitfall guard fired: the job runs, but probably not on the GPUs you meant. `init(strict=True)` raises."""


def pitfall(strict: bool, error: type[PitfallError], message: str) -> None:
    """Raise under strict=True; otherwise warn, attributed to the first caller outside the worker package."""
    if strict:
        raise error(message)
    note(message)


def note(message: str) -> None:
    """Warn with DdpbootWarning, attributed to the first caller outside the worker package; never raises (for what
    ddpboot assumed, rather than a pitfall that strict=True turns into an error)."""
    level = 1
    frame = sys._getframe(0)
    while frame.f_back is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
        level += 1
    warnings.warn(message, DdpbootWarning, stacklevel=level)


def normalize_uuid(uuid: str) -> str:
    """Compare UUIDs whatever their spelling: NVML says `GPU-8c3f...`, torch's `props.uuid` prints `8c3f...`."""
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def visible_devices_changed(cvd: str | None, assigned: Sequence[str]) -> str | None:
    """Under rank isolation the launcher sets CUDA_VISIBLE_DEVICES to exactly the comma-joined DDPBOOT_GPU_UUIDS.

    Returns the warning text when the current value differs (the script or a library changed it), else None.
    """
    if not assigned:
        return None
    if cvd is not None and [normalize_uuid(u) for u in split_uuids(cvd)] == [normalize_uuid(u) for u in assigned]:
        return None
    now = "unset" if cvd is None else repr(cvd)
    return (
        f"CUDA_VISIBLE_DEVICES is {now}, but the ddpboot launcher set it to {','.join(assigned)!r} "
        "(DDPBOOT_GPU_UUIDS): something in this process changed it after launch, so this rank may use a GPU that "
        "belongs to another rank or job. Fix: do not set CUDA_VISIBLE_DEVICES in the script; choose GPUs with "
        "`ddpboot --gpus/--exclude` instead."
    )


def check_visible_devices(env: ClusterEnvironment, strict: bool) -> None:
    """Under rank isolation, the guard for a CUDA_VISIBLE_DEVICES changed since launch (`visible_devices_changed`)."""
    if env.isolation is None or not env.isolation.own_gpus_only:
        return
    changed = visible_devices_changed(os.environ.get("CUDA_VISIBLE_DEVICES"), env.assigned_gpus)
    if changed:
        pitfall(strict, VisibleDevicesChangedError, changed)


def unassigned_gpus(seen: Sequence[str], assigned: Sequence[str]) -> tuple[str, ...]:
    """The UUIDs CUDA shows this process that the launcher did not assign to it."""
    mine = {normalize_uuid(u) for u in assigned}
    return tuple(u for u in seen if normalize_uuid(u) not in mine)


def any_mig(uuids: Sequence[str]) -> bool:
    """Whether any of `uuids` names a MIG instance (`MIG-...`)."""
    return any(u.strip().upper().startswith("MIG-") for u in uuids)


def foreign_cuda_devices(model: nn.Module, device: torch.device) -> list[torch.device]:
    """The CUDA devices other than `device` that hold parameters or buffers of `model`, in name order."""
    seen: set[torch.device] = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        d = tensor.device
        if d.type == "cuda" and d != device:
            seen.add(d)
    return sorted(seen, key=str)
