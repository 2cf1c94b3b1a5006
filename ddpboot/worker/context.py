"""Where this process stands in the job (`Context`), the worker API's one piece of state, and its lifecycle:
`context()` returns the Context of the earlier init(), `shutdown()` forgets it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ddpboot.cluster import ClusterEnvironment
from ddpboot.errors import NotInitializedError


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


@dataclass
class WorkerState:
    """What init() leaves behind for the helpers and for shutdown(); one instance per process (`STATE`)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    context: Context | None = None
    owns_group: bool = False
    """False when init() adopted a process group the script had created itself (the script destroys it)."""
    atexit_registered: bool = False
    plugins_reported: bool = False
    """Whether init() has warned about the environment plugins that could not be loaded (once per process)."""
    kept_environment: ClusterEnvironment | None = None
    """The environment of an init() that exported the torchrun contract itself (under srun). Kept, because those
    variables must not make a later init() (after shutdown()) mistake the job for a torchrun one."""


STATE = WorkerState()


def context() -> Context:
    """The Context of the earlier `init()`; raises NotInitializedError before it."""
    ctx = STATE.context
    if ctx is None:
        raise NotInitializedError(
            "ddpboot has no context yet: this helper needs the ranks and the device. "
            "Fix: call ctx = ddpboot.init() at the start of the script."
        )
    return ctx


def shutdown() -> None:
    """Destroy the process group init() created (not one the script made itself) and forget the context.

    Registered with atexit, so scripts need not call it; calling it twice is harmless. It does not wait at a
    barrier first: after a failure on another rank a barrier would hang.
    """
    end_group(abort=False)


def end_group(abort: bool) -> None:
    """Forget the context and end the process group init() created: destroy it (waits for its pending work to be
    flushed, which needs the peers) or abort it (returns at once, whatever the peers do).

    Aborting is for a failing exit: NCCL's destroy flushes the communicators, and when a peer still waits in a
    collective this rank will never join, that flush waits with it, so the failing rank never exits and the job hangs
    until the collective's timeout (10 minutes by default). torch's own stance is that destroy may hang for a bad
    program and abort is the way out."""
    with STATE.lock:
        if STATE.context is None:
            return
        if STATE.owns_group and dist.is_available() and dist.is_initialized():
            if abort and hasattr(dist.distributed_c10d, "_abort_process_group"):
                dist.distributed_c10d._abort_process_group()
            elif not abort:
                dist.destroy_process_group()
            # A torch without abort: leave the group to the interpreter's teardown, which does not flush.
        STATE.context = None
        STATE.owns_group = False
