"""A job that hangs on purpose, to see what ddpboot shows: rank 0 waits in a barrier that rank 1 never reaches.

    ddpboot --cpu --nproc 2 --stall-timeout 5 examples/hang.py
"""

from __future__ import annotations

import time

import torch.distributed as dist

import ddpboot


def main() -> None:
    ctx = ddpboot.init()
    if ctx.rank == 0:
        dist.barrier()  # waits for rank 1 forever
    else:
        time.sleep(3600)  # rank 1 is busy elsewhere


if __name__ == "__main__":
    main()
