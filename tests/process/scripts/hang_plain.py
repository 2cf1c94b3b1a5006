"""A torchrun-style job that hangs on purpose, written without ddpboot (plain torch.distributed on gloo): its ranks'
stacks come from the faulthandler that the launcher's rank bootstrap registers (tests/process/test_hangs.py).

`data`: rank 1 sleeps in its data loading while rank 0 waits in an all_reduce. `skip`: rank 1 (of 3) skips the
all_reduce and waits in a barrier of another group. `teardown`: rank 0 exits 0 without joining the all_reduce that
rank 1 then waits for in destroy_process_group (a child of rank 0 keeps its connections open, as a leftover worker
process would). Each rank prints `ready` first; the lines the test expects are marked `# <-`."""

import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch() -> None:
    time.sleep(600)  # <- load: a data loader that never returns


def data(rank: int) -> None:
    if rank == 1:
        load_batch()
    dist.all_reduce(torch.ones(1))  # <- data


def skip(rank: int, side: dist.ProcessGroup) -> None:
    if rank == 1:
        dist.barrier(group=side)  # <- skip barrier: rank 1 went past the all_reduce below
    dist.all_reduce(torch.ones(1))  # <- skip all_reduce


def teardown(rank: int) -> None:
    if rank == 0:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        os._exit(0)
    dist.all_reduce(torch.ones(1), async_op=True)
    dist.destroy_process_group()  # <- teardown


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    side = dist.new_group()
    dist.barrier()
    print("ready", flush=True)
    mode = sys.argv[1]
    if mode == "skip":
        skip(rank, side)
    else:
        {"data": data, "teardown": teardown}[mode](rank)


if __name__ == "__main__":
    main()
