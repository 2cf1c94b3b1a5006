"""A job that hangs on purpose (tests/process/test_hangs.py): `barrier` (rank 0 waits in a barrier while rank 1
sleeps elsewhere), `destroy` (rank 1 leaves the collectives while rank 0 has an all_reduce in flight and reaches
destroy_process_group() in a finally: gloo's process group waits there for the all_reduce, as NCCL's does for a
peer that left), `deadlock` (each rank waits to receive from the other). Each rank prints `ready` first."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import ddpboot


def sleep_elsewhere() -> None:
    time.sleep(600)


def barrier(rank: int) -> None:
    if rank == 0:
        dist.barrier()
    else:
        sleep_elsewhere()


def destroy(rank: int) -> None:
    if rank == 1:
        sleep_elsewhere()  # left the training loop: never joins the all_reduce
    try:
        dist.all_reduce(torch.ones(1), async_op=True)
    finally:
        dist.destroy_process_group()


def deadlock(rank: int) -> None:
    t = torch.zeros(1)
    dist.recv(t, src=1 - rank)


def main() -> None:
    ctx = ddpboot.init(backend="gloo")
    dist.barrier()
    print("ready", flush=True)
    {"barrier": barrier, "destroy": destroy, "deadlock": deadlock}[sys.argv[1]](ctx.rank)


if __name__ == "__main__":
    main()
