"""A 1-rank NCCL job for the start-up waterfall: its CUDA context, its group, one all_reduce (NCCL's communicator is
made then), then it waits for RELEASE_FILE so the test can read the launcher's status.json."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"all_reduce {t.item()}", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
    time.sleep(0.05)
dist.destroy_process_group()
