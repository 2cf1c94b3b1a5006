"""A script in the style of many published DDP examples: it checks the GPU count before training and leaves when
there are too few.

    ddpboot --nproc 2 examples/device_count_check.py                     # each rank sees 1 GPU: ddpboot says so
    ddpboot --nproc 2 --isolation node examples/device_count_check.py    # each rank sees both GPUs: it trains

Under ddpboot's default rank isolation each rank sees only its own GPU, so `torch.cuda.device_count()` is 1 in every
rank and this script leaves without training (exit code 0, as it would anywhere). ddpboot reads the script before
the start and names the check, and after the job it reports that no rank joined (docs/guide.md, "Which scripts need
--isolation node"). With `--isolation node` every rank sees all the job's GPUs, as under torchrun.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.device_count() < world_size:
        print(f"Unable to locate sufficient {world_size} gpus to run this example. Exiting.")
        sys.exit()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}: all_reduce gave {t.item():.0f} on cuda:{local_rank} of {torch.cuda.device_count()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
