"""The launch benchmark's job: init the process group, all-reduce once, (optionally hold), exit.

    python scripts/allreduce.py [--backend gloo|nccl] [--hold SECONDS]

Works at any world size (the sum checked is 1 + 2 + … + W) and under any launcher, or started by hand with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (the "bare worker" floor). With nccl it calls
set_device(LOCAL_RANK), the torchrun idiom, which is right under both launchers (ddpboot's rank isolation exports
LOCAL_RANK=0 and shows each worker only its own GPU). --hold keeps the job alive between two all-reduces so that a
launcher's steady-state cost (RSS, CPU time while it supervises) can be measured.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
parser.add_argument("--hold", type=float, default=0.0)
args = parser.parse_args()

device = "cpu"
if args.backend == "nccl":
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = "cuda"
dist.init_process_group(args.backend)
world = dist.get_world_size()
t = torch.ones(4, device=device) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t[0].item() == world * (world + 1) / 2, t
if args.hold > 0:
    time.sleep(args.hold)
    dist.all_reduce(t)
dist.destroy_process_group()
