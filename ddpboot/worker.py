"""The worker side of ddpboot: `init()`, `wrap()`, the small helpers a DDP script needs, and the pitfall guards.

    ctx = ddpboot.init()                   # ranks, device, process group: whoever started this process
    model = ddpboot.wrap(MyModel())        # on ctx.device, inside DistributedDataParallel when world_size > 1
    loader = DataLoader(ds, batch_size=64, sampler=ddpboot.sampler(ds))

Who started the process decides where the ranks come from (`ddpboot.cluster.detect_environment`):

- **the ddpboot launcher** (`launcher == "ddpboot"`): torchrun's environment contract plus `DDPBOOT_LOCAL_RANK` (the
  true node-local index), `DDPBOOT_GPU_UUIDS` (the GPUs the launcher assigned to this rank) and `DDPBOOT_ISOLATION`.
  Under rank isolation (the default) `CUDA_VISIBLE_DEVICES` names only this rank's GPU, so the device is `cuda:0`
  and the exported `LOCAL_RANK` is 0; under node isolation the process sees the node's list and uses
  `cuda:LOCAL_RANK`.
- **torchrun** (`"torchrun"`): the device is `cuda:LOCAL_RANK` (or `cuda:0` when only one GPU is visible, as with
  `--virtual-local-rank` or a per-process CUDA_VISIBLE_DEVICES).
- **srun, one task per GPU** (`"slurm"`): ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS, the master
  address from the first host of SLURM_STEP_NODELIST and the port from the job id (FACTS.md §4). When the task sees
  the whole node's GPUs (and `--gpus-per-task` was not given), init() narrows CUDA_VISIBLE_DEVICES to the task's own
  GPU *before CUDA initialises* (setting CUDA_DEVICE_ORDER=PCI_BUS_ID first when unset, so an index means the GPU
  nvidia-smi shows under it). It then exports the torchrun contract -- MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE -- and joins with `init_method="env://"`, exactly the
  path torchrun workers take; code that reads those variables after init() (and processes the script starts) see
  the same values. As under ddpboot's rank isolation, the exported LOCAL_RANK is the index of the task's GPU among
  those it sees (0 once narrowed); `ctx.local_rank` and SLURM_LOCALID keep the true index. Worker rank 0 hosts the
  TCPStore (an inherited TORCHELASTIC_USE_AGENT_STORE is dropped: there is no agent under srun).
- **plain python** (`"none"`): a world of one. No process group is created (`ctx.backend is None`); every helper
  still works (`wrap` returns the moved model, `barrier` returns at once, `sampler` gives a one-replica sampler).

Pitfall guards warn with `DdpbootWarning` (or raise a `PitfallError` subclass under `init(strict=True)`); each
message says what happened and the one-line fix:

- CUDA_VISIBLE_DEVICES no longer equals what the ddpboot launcher set (under rank isolation, exactly the comma-joined
  `DDPBOOT_GPU_UUIDS`): the script changed it, and this rank may now share a GPU with another.
- CUDA was initialised before init() on a GPU other than this rank's (or, under srun, before the task's
  CUDA_VISIBLE_DEVICES could be narrowed).
- CUDA shows this rank GPUs the launcher did not assign to it (UUIDs compared with `DDPBOOT_GPU_UUIDS`).
- `wrap()` got a model with parameters or buffers on another CUDA device (CPU -> GPU is the normal case: silent).

`torch.load` without `map_location` restores each tensor onto the device it was saved from (typically `cuda:0`
of the saving process); `ddpboot.load` defaults `map_location` to this rank's device instead.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from ddpboot.contract import ISOLATIONS, exit_mark, is_tcp_port
from ddpboot.errors import (
    CudaInitializedEarlyError,
    ModelDeviceError,
    NotInitializedError,
    PitfallError,
    UnassignedGpuError,
    VisibleDevicesChangedError,
    WorkerEnvError,
    WorkerSetupError,
)
from ddpboot.selection.visible import parse_visible_devices

__all__ = [
    "Context",
    "DdpbootWarning",
    "barrier",
    "context",
    "init",
    "is_main",
    "load",
    "main_first",
    "print0",
    "sampler",
    "shutdown",
    "wrap",
]

LAUNCHERS = ("ddpboot", "torchrun", "slurm", "none")


class DdpbootWarning(UserWarning):
    """A pitfall guard fired: the job runs, but probably not on the GPUs you meant. `init(strict=True)` raises."""


@dataclass(frozen=True)
class Context:
    """Where this process stands in the job. Returned by `init()`; `ddpboot.context()` returns it again.

    `local_rank` is the true node-local index (not the exported LOCAL_RANK, which is 0 under rank isolation).
    `backend` is None when no process group exists (plain python). `gpu_uuids` are the GPUs the ddpboot launcher
    assigned to this rank (DDPBOOT_GPU_UUIDS), else the UUID CUDA reports for `device`; empty on CPU.
    Usable as a context manager: `with ddpboot.init() as ctx:` shuts the process group down on the way out.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None
    gpu_uuids: tuple[str, ...]
    launcher: str
    strict: bool = field(default=False, compare=False)

    @property
    def is_main(self) -> bool:
        """Global rank 0: the process that logs, saves checkpoints and downloads data."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group exists (any launcher, even with one process); False in plain python."""
        return self.backend is not None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        shutdown()


_lock = threading.RLock()
_context: Context | None = None
_owns_group = False  # False when init() adopted a process group the script had created itself
_atexit_registered = False
_first_launcher: tuple[str, Any] | None = None  # (launcher, environment) of the first init(); see _detect()


# --------------------------------------------------------------------------------------------------- pure helpers


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


def _uses_nccl(backend: str | None) -> bool:
    return backend is not None and "nccl" in backend


def check_ranks(
    rank: int, world_size: int, local_rank: int, local_world_size: int, node_rank: int, names: Mapping[str, str]
) -> None:
    """Reject rank numbers that contradict each other, naming the variables they came from (`names`)."""

    def bad(what: str) -> WorkerEnvError:
        return WorkerEnvError(
            f"{what}. The launcher's environment is inconsistent; fix: start the script with ddpboot, torchrun or "
            "srun, or without any of these variables for a single process."
        )

    n = names
    if world_size < 1:
        raise bad(f"{n['world_size']}={world_size}: the world size must be at least 1")
    if not 0 <= rank < world_size:
        raise bad(f"{n['rank']}={rank} is not below {n['world_size']}={world_size}")
    if local_world_size < 1 or local_world_size > world_size:
        raise bad(f"{n['local_world_size']}={local_world_size} must be between 1 and {n['world_size']}={world_size}")
    if not 0 <= local_rank < local_world_size:
        raise bad(f"{n['local_rank']}={local_rank} is not below {n['local_world_size']}={local_world_size}")
    if node_rank < 0:
        raise bad(f"{n['node_rank']}={node_rank} is negative")


def parse_int_var(env: Mapping[str, str], name: str) -> int:
    """An integer environment variable, or a WorkerEnvError that names it."""
    raw = env.get(name)
    if raw is None:
        raise WorkerEnvError(
            f"{name} is not set, but the rest of the environment says a launcher started this process. "
            "Fix: start the script through the launcher (ddpboot/torchrun/srun), not by hand with a partial "
            "environment."
        )
    try:
        return int(raw.strip())
    except ValueError:
        raise WorkerEnvError(
            f"{name}={raw!r} is not an integer. Fix: let the launcher set {name}, or unset it."
        ) from None


def check_master(env: Mapping[str, str]) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT as env:// rendezvous needs them: both set, the port a number in 1..65535."""
    addr = env.get("MASTER_ADDR", "").strip()
    if "MASTER_PORT" not in env:
        raise WorkerEnvError(
            "MASTER_PORT is not set, but RANK/WORLD_SIZE say a launcher started this process: the workers cannot "
            "find the rendezvous store. Fix: start the script with ddpboot or torchrun (they set it), or export "
            "MASTER_PORT=<free port> on every rank."
        )
    port = parse_int_var(env, "MASTER_PORT")
    if not is_tcp_port(port):
        raise WorkerEnvError(f"MASTER_PORT={port} is not a TCP port (1-65535). Fix: export a port in that range.")
    if not addr:
        raise WorkerEnvError(
            "MASTER_ADDR is not set, but RANK/WORLD_SIZE say a launcher started this process. Fix: start the script "
            "with ddpboot or torchrun, or export MASTER_ADDR=<address of rank 0> on every rank."
        )
    return addr, port


def split_uuids(value: str | None) -> tuple[str, ...]:
    """DDPBOOT_GPU_UUIDS (or a UUID CUDA_VISIBLE_DEVICES) as a tuple; empty for None or ''."""
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


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


def unassigned_gpus(seen: Sequence[str], assigned: Sequence[str]) -> tuple[str, ...]:
    """The UUIDs CUDA shows this process that the launcher did not assign to it."""
    mine = {normalize_uuid(u) for u in assigned}
    return tuple(u for u in seen if normalize_uuid(u) not in mine)


def slurm_visible_devices(
    cvd: str | None, visible_count: int, local_rank: int, local_world_size: int, gpus_per_task: bool
) -> str | None:
    """The CUDA_VISIBLE_DEVICES that leaves an srun task only its own GPU, or None to leave the variable alone.

    Narrow only when the task sees several GPUs that are the node's (one task per GPU, no `--gpus-per-task`): task
    SLURM_LOCALID=i then takes entry i of the list (or index i when the variable is unset). With `--gpus-per-task`
    SLURM already gave every task its own list, whose first entry is the task's device.
    """
    if gpus_per_task or visible_count < 2:
        return None
    if visible_count < local_world_size:
        raise WorkerEnvError(
            f"srun started {local_world_size} tasks on this node but this task sees {visible_count} GPUs, so they "
            "cannot have one GPU each (NCCL refuses two ranks on one GPU). Fix: srun "
            f"--ntasks-per-node={visible_count}, or give each task its own GPU with --gpus-per-task=1."
        )
    entries = parse_visible_devices(cvd)
    if entries is None:
        return str(local_rank)
    return entries[local_rank]


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


# ------------------------------------------------------------------------------------------------------ the guards


def _pitfall(strict: bool, error: type[PitfallError], message: str) -> None:
    """Raise under strict=True; otherwise warn, attributed to the first caller outside this module."""
    if strict:
        raise error(message)
    level = 1
    frame = sys._getframe(0)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
        level += 1
    warnings.warn(message, DdpbootWarning, stacklevel=level)


def _cuda_uuid(index: int) -> str:
    """The NVML spelling (`GPU-...`) of a visible device's UUID; torch prints the bare hex groups."""
    text = str(torch.cuda.get_device_properties(index).uuid)
    return text if text.upper().startswith(("GPU-", "MIG-")) else "GPU-" + text


def _any_mig(uuids: Sequence[str]) -> bool:
    return any(u.strip().upper().startswith("MIG-") for u in uuids)


def _cuda_initialized() -> bool:
    """torch.cuda.is_initialized, typed (torch leaves it unannotated)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _foreign_cuda_devices(model: nn.Module, device: torch.device) -> list[torch.device]:
    seen: set[torch.device] = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        d = tensor.device
        if d.type == "cuda" and d != device:
            seen.add(d)
    return sorted(seen, key=str)


# ----------------------------------------------------------------------------------------------------- the API


def init(
    backend: str | None = None,
    timeout: float | timedelta | None = None,
    strict: bool = False,
) -> Context:
    """Join the job this process belongs to and return its `Context`; a second call returns the same one.

    backend: None picks nccl when this rank has a GPU and gloo otherwise; any torch.distributed backend name (or a
      composite like `cpu:gloo,cuda:nccl`) overrides it.
    timeout: seconds (or a timedelta) for collectives and the rendezvous; None keeps torch's default.
    strict: pitfall guards raise a `PitfallError` subclass instead of warning with `DdpbootWarning`.

    The device is chosen and `torch.cuda.set_device` called before `init_process_group`, so NCCL and every later
    `.cuda()` land on this rank's GPU. `ddpboot.shutdown()` runs at exit.
    """
    global _context, _atexit_registered
    with _lock:
        if _context is not None:
            if backend is not None and normalize_backend(backend) != _context.backend:
                raise WorkerSetupError(
                    f"ddpboot.init(backend={backend!r}) after an earlier init() chose backend {_context.backend!r}: "
                    "a process has one default process group. Fix: call init() once, or ddpboot.shutdown() first."
                )
            return _context
        requested = normalize_backend(backend) if backend is not None else None
        _context = _start(requested, _as_timedelta(timeout), strict)
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        return _context


def _as_timedelta(timeout: float | timedelta | None) -> timedelta | None:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise WorkerSetupError(
            f"ddpboot.init(timeout={timeout!r}): give a positive number of seconds or a datetime.timedelta."
        )
    return timedelta(seconds=float(timeout))


def _detect() -> tuple[str, Any]:
    """(launcher, environment). Once init() has exported the torchrun contract (under srun), the first answer is
    kept: those variables must not make a later init() (after shutdown()) mistake the job for a torchrun one."""
    if _first_launcher is not None:
        return _first_launcher
    from ddpboot.cluster import SlurmEnvironment, TorchrunEnvironment, detect_environment

    env = detect_environment()
    if env is None:
        return ("none", None)
    if isinstance(env, TorchrunEnvironment):
        launcher = "ddpboot" if env.launched_by_ddpboot else "torchrun"
    elif isinstance(env, SlurmEnvironment):
        launcher = "slurm"
    else:  # a future source of ranks (LSF, Kubernetes...): joined like srun, by exporting the torchrun contract
        launcher = str(env.name)
    return (launcher, env)


def _start(requested: str | None, timeout: timedelta | None, strict: bool) -> Context:
    global _owns_group, _first_launcher
    launcher, env = _detect()
    environ = os.environ
    if env is None and dist.is_available() and dist.is_initialized():
        # No launcher, but the script made its own group (mp.spawn style): one node, ranks from the group.
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank, local_world_size, node_rank, nnodes = rank, world_size, 0, 1
    elif env is None:
        _check_no_partial_contract(environ)
        rank, world_size, local_rank, local_world_size, node_rank, nnodes = 0, 1, 0, 1, 0, 1
    else:
        rank, world_size = env.global_rank, env.world_size
        local_rank, local_world_size = env.local_rank, env.local_world_size
        node_rank, nnodes = env.node_rank, env.nnodes
    torchrun_like = launcher in ("ddpboot", "torchrun")
    if launcher == "slurm":
        names = {
            "rank": "SLURM_PROCID",
            "world_size": "SLURM_NTASKS",
            "local_rank": "SLURM_LOCALID",
            "local_world_size": "tasks on this node (SLURM_STEP_TASKS_PER_NODE)",
            "node_rank": "SLURM_NODEID",
        }
    else:
        names = {
            "rank": "RANK",
            "world_size": "WORLD_SIZE",
            "local_rank": "DDPBOOT_LOCAL_RANK" if "DDPBOOT_LOCAL_RANK" in environ else "LOCAL_RANK",
            "local_world_size": "LOCAL_WORLD_SIZE",
            "node_rank": "GROUP_RANK",
        }
    check_ranks(rank, world_size, local_rank, local_world_size, node_rank, names)

    assigned: tuple[str, ...] = ()
    isolation = "node"
    device_local = local_rank  # index of this rank's GPU among the visible ones (LOCAL_RANK may differ)
    if torchrun_like:
        check_master(environ)
        device_local = parse_int_var(environ, "LOCAL_RANK")
    if launcher == "ddpboot":
        assigned = split_uuids(environ.get("DDPBOOT_GPU_UUIDS"))
        isolation = environ.get("DDPBOOT_ISOLATION", "rank").strip() or "rank"
        if isolation not in ISOLATIONS:
            raise WorkerEnvError(
                f"DDPBOOT_ISOLATION={isolation!r} is neither 'rank' nor 'node'. Fix: let the ddpboot launcher set it."
            )
    changed = None
    if launcher == "ddpboot" and isolation == "rank":
        changed = visible_devices_changed(environ.get("CUDA_VISIBLE_DEVICES"), assigned)
        if changed:
            _pitfall(strict, VisibleDevicesChangedError, changed)

    early_reported = False
    if launcher == "slurm":
        device_local, early_reported = _narrow_for_srun(local_rank, local_world_size, strict)

    count = torch.cuda.device_count()
    if count > 0:
        index = select_device_index(device_local, count, "SLURM_LOCALID" if launcher == "slurm" else "LOCAL_RANK")
        device = torch.device("cuda", index)
        if _cuda_initialized() and not early_reported:
            current = torch.cuda.current_device()
            if current != index:
                _pitfall(
                    strict,
                    CudaInitializedEarlyError,
                    f"CUDA was initialised on cuda:{current} before ddpboot.init(), but this rank's GPU is "
                    f"cuda:{index}: tensors made so far, and a CUDA context of several hundred MiB, sit on another "
                    "rank's GPU. Fix: call ddpboot.init() before creating any CUDA tensor or model.",
                )
        torch.cuda.set_device(device)
        # MIG instances: torch reports no MIG-... UUID to compare with, so the check is left out.
        if launcher == "ddpboot" and isolation == "rank" and assigned and not _any_mig(assigned):
            extra = unassigned_gpus([_cuda_uuid(i) for i in range(count)], assigned)
            if extra:
                _pitfall(
                    strict,
                    UnassignedGpuError,
                    f"CUDA shows this rank {count} GPUs, including {', '.join(extra)}, which the ddpboot launcher "
                    f"did not assign to it (DDPBOOT_GPU_UUIDS={','.join(assigned)}): it may compete with other "
                    "ranks for them. Fix: leave CUDA_VISIBLE_DEVICES as the launcher set it.",
                )
        uuids = assigned or (_cuda_uuid(index),)
    else:
        device = torch.device("cpu")
        uuids = assigned  # a simulated inventory (DDPBOOT_FAKE_GPUS) plans GPUs for ranks that run on CPU

    chosen = requested or ("nccl" if device.type == "cuda" else "gloo")
    backend_used: str | None = None
    needs_group = launcher != "none" or (dist.is_available() and dist.is_initialized())
    if requested is not None or needs_group:  # an impossible request fails in plain python too
        _check_backend_usable(chosen, device)
    if not needs_group:
        _owns_group = False  # a world of one needs no process group
    else:
        if launcher not in ("none", "ddpboot", "torchrun"):
            _export_contract(env, rank, world_size, device, local_rank, local_world_size, node_rank, nnodes)
            _first_launcher = (launcher, env)
        if dist.is_initialized():  # the script made its own group: adopt it, leave it to the script to destroy
            if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
                raise WorkerEnvError(
                    f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, but "
                    f"the environment says rank {rank} of {world_size}. Fix: drop the script's own "
                    "init_process_group() call and let ddpboot.init() create the group."
                )
            backend_used = str(dist.get_backend())
            _owns_group = False
        else:
            kwargs: dict[str, Any] = {}
            if timeout is not None:
                kwargs["timeout"] = timeout
            if device.type == "cuda" and _uses_nccl(chosen):
                kwargs["device_id"] = device  # binds NCCL to this GPU: eager communicator, barrier on the right GPU
            dist.init_process_group(chosen, init_method="env://", rank=rank, world_size=world_size, **kwargs)
            backend_used = chosen
            _owns_group = True

    return Context(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        device=device,
        backend=backend_used,
        gpu_uuids=tuple(uuids),
        launcher=launcher,
        strict=strict,
    )


def _check_no_partial_contract(environ: Mapping[str, str]) -> None:
    """No launcher was detected, yet RANK/WORLD_SIZE say this is one rank of several: running on as a world of one
    would silently train N independent models, so name what is missing instead."""
    rank = environ.get("RANK", "").strip()
    world = environ.get("WORLD_SIZE", "").strip()
    if rank in ("", "0") and world in ("", "1"):
        return
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not environ.get(v, "").strip()]
    raise WorkerEnvError(
        f"RANK={rank or '(unset)'} and WORLD_SIZE={world or '(unset)'} say this process is one rank of a job, but "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so it cannot join the others. Fix: "
        "start the script with ddpboot or torchrun, or export all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
        "(or none of them, for a single process)."
    )


def _check_backend_usable(backend: str, device: torch.device) -> None:
    if not dist.is_available():
        raise WorkerSetupError(
            "this torch build has no torch.distributed. Fix: install a torch build with distributed support."
        )
    if _uses_nccl(backend) and device.type != "cuda" and ":" not in backend:
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


def _narrow_for_srun(local_rank: int, local_world_size: int, strict: bool) -> tuple[int, bool]:
    """Give an srun task only its own GPU; return (index of its GPU among the visible ones, early-init reported)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(raw)
    # Counting from the variable itself keeps CUDA untouched; only an unset variable needs torch (which asks NVML).
    count = len(entries) if entries is not None else torch.cuda.device_count()
    if count <= 1:
        return 0, False
    per_task = bool(os.environ.get("SLURM_GPUS_PER_TASK", "").strip())
    narrowed = slurm_visible_devices(raw, count, local_rank, local_world_size, per_task)
    if narrowed is None:
        return 0, False
    if _cuda_initialized():
        _pitfall(
            strict,
            CudaInitializedEarlyError,
            f"CUDA was initialised before ddpboot.init(), so this srun task keeps seeing all {count} GPUs of the "
            f"node instead of only its own (cuda:{local_rank}); CUDA calls made so far ran on cuda:0. "
            "Fix: call ddpboot.init() before any CUDA call.",
        )
        return local_rank, True
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    os.environ["CUDA_VISIBLE_DEVICES"] = narrowed
    return 0, False


def _export_contract(
    env: Any,
    rank: int,
    world_size: int,
    device: torch.device,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    nnodes: int,
) -> None:
    """Publish torchrun's variables so env:// rendezvous, and code that reads them later, see this rank's place."""
    os.environ.update(
        {
            "MASTER_ADDR": str(env.main_address),
            "MASTER_PORT": str(env.main_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(device.index if device.type == "cuda" else local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "GROUP_RANK": str(node_rank),
            "GROUP_WORLD_SIZE": str(nnodes),
        }
    )
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # no agent hosts a store here: worker rank 0 does


def _shutdown_at_exit() -> None:
    """shutdown() at interpreter exit, announced first. Destroying the process group while another rank still waits
    in a collective makes that rank fail at once, often before this process has finished exiting; the mark (written
    before anything is torn down) tells ddpboot's launcher that this rank was leaving first, so that it waits for
    this rank's own exit code instead of blaming the rank that merely lost its peer."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and os.environ.get("DDPBOOT_LOCAL_RANK") is not None and not _failed_collective():
        with contextlib.suppress(OSError):
            exit_mark(error_file).write_text(f"{time.time():.6f}\n")
    shutdown()


_PEER_GONE = ("/gloo/", "Connection closed by peer", "Connection reset by peer", "NCCL")


def _failed_collective() -> bool:
    """Whether the interpreter is exiting because a collective failed (a peer went away): such a rank is not
    leaving of its own accord, so it writes no at-exit mark; the rank whose leaving broke the collective is the root
    cause (it exited first, or marked itself before tearing the group down)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # set for an uncaught exception
    if exc is None:
        return False
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_GONE)


def shutdown() -> None:
    """Destroy the process group init() created (not one the script made itself) and forget the context.

    Registered with atexit, so scripts need not call it; calling it twice is harmless. It does not wait at a
    barrier first: after a failure on another rank a barrier would hang.
    """
    global _context, _owns_group
    with _lock:
        if _context is None:
            return
        if _owns_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        _context = None
        _owns_group = False


def context() -> Context:
    """The Context of the earlier `init()`; raises NotInitializedError before it."""
    ctx = _context
    if ctx is None:
        raise NotInitializedError(
            "ddpboot has no context yet: this helper needs the ranks and the device. "
            "Fix: call ctx = ddpboot.init() at the start of the script."
        )
    return ctx


def wrap(model: nn.Module, **ddp_kwargs: Any) -> nn.Module:
    """Move `model` to this rank's device and wrap it in DistributedDataParallel.

    On a GPU `device_ids` and `output_device` default to this rank's GPU; on CPU they are left out (DDP wants
    none). Other keyword arguments go to DDP unchanged. In a world of one the moved model is returned as it is
    (ddp_kwargs are then unused), and a model that is already a DDP is returned untouched.
    """
    if not isinstance(model, nn.Module):
        raise WorkerSetupError(
            f"ddpboot.wrap() takes a torch.nn.Module, got {type(model).__name__}. "
            "Fix: pass the model itself (e.g. ddpboot.wrap(MyModel())), not its parameters, a state dict or a class."
        )
    ctx = context()
    if isinstance(model, DistributedDataParallel):
        return model
    foreign = _foreign_cuda_devices(model, ctx.device)
    if foreign:
        where = ", ".join(str(d) for d in foreign)
        _pitfall(
            ctx.strict,
            ModelDeviceError,
            f"ddpboot.wrap(): the model's parameters are on {where}, but this rank's device is {ctx.device}; wrap() "
            f"moves them, but they already took memory on {where}, which may be another rank's GPU. "
            "Fix: build the model on CPU (or on ddpboot.context().device) and let wrap() move it.",
        )
    model = model.to(ctx.device)
    if ctx.world_size == 1 or not ctx.distributed:
        return model
    if ctx.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [ctx.device.index])
        ddp_kwargs.setdefault("output_device", ctx.device.index)
    return DistributedDataParallel(model, **ddp_kwargs)


def barrier() -> None:
    """Wait until every rank gets here; returns at once in a world of one."""
    ctx = context()
    if not ctx.distributed or ctx.world_size == 1:
        return
    if ctx.device.type == "cuda" and _uses_nccl(ctx.backend):
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def is_main() -> bool:
    """True on global rank 0. Before init() the rank is read from the environment, so it works at import time."""
    ctx = _context
    if ctx is not None:
        return ctx.is_main
    _, env = _detect()
    return env is None or env.global_rank == 0


def print0(*args: Any, **kwargs: Any) -> None:
    """print() on global rank 0 only; flushes by default, since workers' stdout is usually a pipe."""
    if is_main():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


@contextmanager
def main_first(local: bool = False) -> Iterator[None]:
    """Run the block on rank 0 first (e.g. a dataset download), then on the other ranks, which wait at a barrier.

    local=True: the first process of each node goes first (node-local disks). If the first rank's block raises,
    it does not release the others: they wait until the launcher stops the job (ddpboot and torchrun fail fast), or
    until the process group's timeout under srun, rather than carry on with a half-written download.
    """
    ctx = context()
    first = ctx.local_rank == 0 if local else ctx.is_main
    if not first:
        barrier()
    yield
    if first:
        barrier()


def sampler(
    dataset: Dataset[Any] | Sized, shuffle: bool = True, seed: int = 0, drop_last: bool = False
) -> DistributedSampler[Any]:
    """A DistributedSampler giving this rank its share of `dataset`; pass it as DataLoader(sampler=...).

    Always a DistributedSampler, also in a world of one (one replica, the whole dataset), so the same script runs
    everywhere and `sampler.set_epoch(epoch)` -- needed for a new shuffle every epoch -- is always there.
    """
    ctx = context()
    return DistributedSampler(
        cast("Dataset[Any]", dataset),
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )


def load(path: Any, **kwargs: Any) -> Any:
    """torch.load with `map_location` defaulting to this rank's device (CPU before init()).

    Plain torch.load without map_location puts every tensor back on the device it was saved from -- usually cuda:0
    of the saving rank -- which is another rank's GPU unless each rank sees only its own.
    """
    if "map_location" not in kwargs:
        kwargs["map_location"] = _context.device if _context is not None else torch.device("cpu")
    return torch.load(path, **kwargs)
