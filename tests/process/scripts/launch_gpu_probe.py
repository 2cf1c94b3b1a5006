"""An unmodified torchrun-style GPU rank: set_device(LOCAL_RANK), a DDP step over NCCL, then report which physical
GPU it ran on (by UUID) next to what the launcher exported. Writes LAUNCH_TEST_OUT/rank<R>.json.

Run on a GPU machine under ddpboot (both isolation modes) and torchrun; each rank must be on its own GPU, and
under ddpboot on the GPU named by DDPBOOT_GPU_UUIDS.
"""

from __future__ import annotations

import faulthandler
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

if os.environ.get("LAUNCH_TEST_DUMP_AFTER"):  # a hang shows where it is stuck, then the rank exits
    faulthandler.dump_traceback_later(float(os.environ["LAUNCH_TEST_DUMP_AFTER"]), exit=True)
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = nn.Linear(8, 1).to(local_rank)
ddp = DDP(model, device_ids=[local_rank])
ddp(torch.full((4, 8), float(dist.get_rank() + 1), device=local_rank)).sum().backward()
grads = [round(g, 4) for g in model.weight.grad.flatten().tolist()]
props = torch.cuda.get_device_properties(local_rank)
out = Path(os.environ["LAUNCH_TEST_OUT"])
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps({
    "rank": dist.get_rank(),
    "local_rank": local_rank,
    "visible": torch.cuda.device_count(),
    "uuid": "GPU-" + str(props.uuid),
    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "assigned": os.environ.get("DDPBOOT_GPU_UUIDS"),
    "grads": grads,
}))
dist.destroy_process_group()
