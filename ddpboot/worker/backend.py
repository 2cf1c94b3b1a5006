"""Which torch.distributed backend: the name checked before anything starts, and usable on this rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddpboot.errors import WorkerSetupError


def normalize_backend(name: object) -> str:
    """Check a backend name against torch.distributed's list; composite specs (`cpu:gloo,cuda:nccl`) are allowed.

    Checked before anything is touched, so a typo costs nothing but this message.
    """
    known = sorted(b for b in dist.Backend.backend_list if b not in ("undefined", "fake", ""))
    fix = f"Fix: pass backend=None (nccl on GPUs, gloo on CPU) or one of {', '.join(known)}."
    if not isinstance(name, str) or not name.strip():
        raise WorkerSetupError(f"ddpboot.init(backend={name!r}): the backend must be a non-empty string. {fix}")
    text = name.strip().lower()
    for part in text.split(","):
        device, sep, backend = part.strip().rpartition(":")
        if (sep and device not in ("cpu", "cuda", "xpu")) or backend not in known:
            raise WorkerSetupError(f"ddpboot.init(backend={name!r}): unknown backend {part.strip()!r}. {fix}")
    return text


def uses_nccl(backend: str | None) -> bool:
    """Whether `backend` (plain or composite) puts any device on NCCL."""
    return backend is not None and "nccl" in backend


def check_backend_usable(backend: str, device: torch.device) -> None:
    """Raise WorkerSetupError when this torch build or this rank's device cannot run `backend`."""
    if not dist.is_available():
        raise WorkerSetupError(
            "this torch build has no torch.distributed. Fix: install a torch build with distributed support."
        )
    if uses_nccl(backend) and device.type != "cuda" and ":" not in backend:
        raise WorkerSetupError(
            f"ddpboot.init(backend={backend!r}) but this rank has no GPU (torch.cuda.device_count() is 0). "
            "Fix: pass backend='gloo' (or None) on CPU, or run where this rank has a GPU."
        )
    for name, available in (("nccl", dist.is_nccl_available), ("gloo", dist.is_gloo_available)):
        if name in backend and not available():
            raise WorkerSetupError(
                f"ddpboot.init(backend={backend!r}) but this torch build has no {name}. Fix: pass backend=None "
                "to let ddpboot pick one that exists here."
            )
