"""Run by the GPU tests under ddpboot: what this rank was given and which GPU it really computes on."""

import json
import os

import torch

import ddpboot

ctx = ddpboot.init()
torch.ones(1, device=ctx.device)  # make sure a context exists on the rank's device
uuid = "GPU-" + str(torch.cuda.get_device_properties(ctx.device).uuid)
print("PROBE " + json.dumps({
    "rank": ctx.rank,
    "DDPBOOT_GPU_UUIDS": os.environ.get("DDPBOOT_GPU_UUIDS"),
    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
    "current_uuid": uuid,
    "cpus": sorted(os.sched_getaffinity(0)),
}), flush=True)
ddpboot.shutdown()
