"""ddpboot: start PyTorch DistributedDataParallel jobs on exactly the GPUs you mean, and on nothing else.

The launcher (`ddpboot --nproc 4 train.py`) is a torchrun-compatible command; inside the script the worker API
does the set_device / init_process_group / DistributedDataParallel steps, whoever started the process (ddpboot,
torchrun, srun or plain python):

    import ddpboot

    ctx = ddpboot.init()                       # Context: rank, world_size, local_rank, device, backend, ...
    model = ddpboot.wrap(MyModel())            # moved to ctx.device; DDP when world_size > 1
    loader = DataLoader(ds, batch_size=64, sampler=ddpboot.sampler(ds))
    ddpboot.print0("rank 0 only")

The worker API lives in `ddpboot.worker` and is loaded on first use: `import ddpboot` does not import torch, so
the CLI (`ddpboot plan`, `ddpboot gpus`) starts in a fraction of a second.
"""

import typing as _typing

from ddpboot.errors import DdpbootError, PitfallError

__version__ = "0.1.0"

__all__ = [
    "Context",
    "DdpbootError",
    "DdpbootWarning",
    "PitfallError",
    "__version__",
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
# The names ddpboot.worker exports, loaded on first use (the errors and the version need no torch).
_WORKER_NAMES = frozenset(__all__) - {"__version__", "DdpbootError", "PitfallError"}

if _typing.TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__ below
    from ddpboot.worker import (
        Context,
        DdpbootWarning,
        barrier,
        context,
        init,
        is_main,
        load,
        main_first,
        print0,
        sampler,
        shutdown,
        wrap,
    )


def __getattr__(name: str) -> _typing.Any:
    """Import ddpboot.worker (and with it torch) only when a script first touches the worker API."""
    if name in _WORKER_NAMES:
        from ddpboot import worker

        value = getattr(worker, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'ddpboot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({n for n in globals() if not n.startswith("_")} | set(__all__))
