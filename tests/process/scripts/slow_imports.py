"""A 2-rank gloo job whose rank SLOW_RANK (unset: none) spends SLOW_SECONDS (default 4) in its imports, before torch's:
the start-up waterfall names that rank and phase. With SLOW_HOLD=PATH the ranks wait for PATH before they end."""

from __future__ import annotations

import os
import time

if os.environ["RANK"] == os.environ.get("SLOW_RANK"):
    time.sleep(float(os.environ.get("SLOW_SECONDS", "4")))  # a module that is slow to import

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} up", flush=True)
if "SLOW_HOLD" in os.environ:  # hold the job until the test has read its status file
    while not os.path.exists(os.environ["SLOW_HOLD"]):
        time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # skips gloo's teardown race (docs/guide.md, exit 134)
