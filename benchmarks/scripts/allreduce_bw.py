"""NCCL all_reduce bus bandwidth, bf16, 1 MiB … 1 GiB (powers of 2), nccl-tests' definitions.

    launcher ... scripts/allreduce_bw.py OUT.json [--min-mib 1] [--max-mib 1024] [--warmup 5] [--iters 20]

For each size: warm-up all-reduces, then ITERS timed back to back between CUDA events; time = elapsed / ITERS;
algbw = bytes / time; busbw = algbw × 2(n−1)/n (nccl-tests' all_reduce bus bandwidth, comparable across world sizes).
Rank 0 writes OUT.json. set_device(LOCAL_RANK) is right under rank isolation (LOCAL_RANK=0, one visible GPU) and node
isolation (the true index, every selected GPU visible).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--min-mib", type=int, default=1)
parser.add_argument("--max-mib", type=int, default=1024)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--iters", type=int, default=20)
args = parser.parse_args()

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
n = dist.get_world_size()
results = []
size = args.min_mib << 20
while size <= args.max_mib << 20:
    t = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(args.warmup):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    dist.barrier(device_ids=[torch.cuda.current_device()])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        dist.all_reduce(t)
    end.record()
    torch.cuda.synchronize()
    took = start.elapsed_time(end) / 1000 / args.iters
    algbw = size / took / 1e9
    results.append({"bytes": size, "time_s": took, "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n})
    del t
    size *= 2
if dist.get_rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"world_size": n, "visible_devices": torch.cuda.device_count(),
                   "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "results": results}, f)
dist.destroy_process_group()
