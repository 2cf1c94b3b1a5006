"""The helpers a DDP script needs after init(): wrap the model, shard the data, synchronise, print and load.

Each works in a world of one too (plain python): `wrap` returns the moved model, `barrier` returns at once,
`sampler` gives a one-replica sampler.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sized
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from ddpboot.errors import ModelDeviceError, WorkerSetupError
from ddpboot.worker.backend import uses_nccl
from ddpboot.worker.context import STATE, context
from ddpboot.worker.guards import foreign_cuda_devices, pitfall
from ddpboot.worker.start import current_environment


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
    foreign = foreign_cuda_devices(model, ctx.device)
    if foreign:
        where = ", ".join(str(d) for d in foreign)
        pitfall(
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
    if ctx.device.type == "cuda" and uses_nccl(ctx.backend):
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def is_main() -> bool:
    """True on global rank 0. Before init() the rank is read from the environment, so it works at import time."""
    ctx = STATE.context
    if ctx is not None:
        return ctx.is_main
    env = current_environment()
    return env is None or env.global_rank == 0


def print0(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None, flush: bool = True) -> None:
    """print() on global rank 0 only; flushes by default, since workers' stdout is usually a pipe.

    The line goes out in one write: print() writes the text and its end separately, and where the ranks share one
    stream (torchrun without --tee, srun) another rank's output can land between the two."""
    if is_main():
        text = (" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end)
        stream = sys.stdout if file is None else file
        stream.write(text)
        if flush:
            stream.flush()


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
        ctx = STATE.context
        kwargs["map_location"] = ctx.device if ctx is not None else torch.device("cpu")
    return torch.load(path, **kwargs)
