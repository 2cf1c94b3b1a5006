"""A classic torchrun script that never calls set_device: the way stray contexts land on GPU 0.

    launcher ... scripts/classic_leak.py PID_DIR [--hold SECONDS]

It puts its tensor on cuda:LOCAL_RANK (as pytorch/examples' DDP tutorial does with `.to(local_rank)`) but never
calls torch.cuda.set_device, so the *current* device stays cuda:0. Then it does what such scripts do: an NCCL
`barrier()` without device_ids and a `torch.cuda.synchronize()` (timing code), both of which act on the current
device. Under `CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2`, rank 1's cuda:0 is physical GPU 0: it creates
a CUDA context there (~500 MiB on an H200, FACTS §2). Under ddpboot's rank isolation each worker sees only its own
GPU, so cuda:0 is that GPU and nothing lands elsewhere. Each rank writes PID_DIR/rank<R> (its pid, LOCAL_RANK,
CUDA_VISIBLE_DEVICES) and holds a few seconds so the sampler sees the steady state.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("pid_dir")
parser.add_argument("--hold", type=float, default=3.0)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")
t = torch.ones(1 << 20, device=f"cuda:{local_rank}")
dist.all_reduce(t)
dist.barrier()
torch.cuda.synchronize()
with open(os.path.join(args.pid_dir, f"rank{dist.get_rank()}"), "w") as f:
    json.dump({"pid": os.getpid(), "local_rank": local_rank,
               "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}, f)
time.sleep(args.hold)
dist.destroy_process_group()
