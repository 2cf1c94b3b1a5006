"""A script in the style of published examples that checks the GPU count before training.

With COUNT_FOR_REAL=1 it imports torch and counts; otherwise it only contains the check (the launcher reads the
source) and exits at once. With JOIN=1 it joins the process group (env://) before leaving.
"""

import os
import sys

if os.environ.get("COUNT_FOR_REAL"):
    import torch

    if torch.cuda.device_count() < int(os.environ["WORLD_SIZE"]):
        print(f"Unable to locate sufficient {os.environ['WORLD_SIZE']} gpus to run this example. Exiting.")
        sys.exit()
if os.environ.get("JOIN"):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
