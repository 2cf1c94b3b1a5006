"""A 2-rank gloo job of STEPS steps: each rank computes (a busy loop of UNIT seconds of its own CPU time, so a crowded
machine stretches it but keeps the proportion), then both all_reduce. argv[1] `slow`: rank 1 computes SLOW times as
long before each all_reduce; `even`: both compute the same (tests/process/test_stragglers.py)."""

import sys
import time

import torch
import torch.distributed as dist

STEPS, UNIT, SLOW = 40, 0.05, 6


def compute(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for _ in range(STEPS):
    compute(UNIT * (SLOW if sys.argv[1] == "slow" and rank == 1 else 1) * (SLOW if sys.argv[1] == "even" else 1))
    dist.all_reduce(t)
print(f"rank {rank}: {STEPS} steps", flush=True)
dist.destroy_process_group()
