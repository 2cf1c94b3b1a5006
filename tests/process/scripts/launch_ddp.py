"""A torchrun-style DDP script, unmodified for any launcher: init from env://, one DDP step, report what it saw.

The data differ per rank, so the step's gradients are equal across ranks only if DDP all-reduced them. Writes
LAUNCH_TEST_OUT/rank<R>.json with the environment, the gradients and the averaged expectation.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


@record
def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])  # what torchrun scripts read; cuda:LOCAL_RANK on GPUs
    torch.manual_seed(0)
    model = nn.Linear(4, 1, bias=False)
    ddp = DDP(model)
    x = torch.full((2, 4), float(rank + 1))
    ddp(x).sum().backward()
    grad = model.weight.grad.detach().flatten().tolist()
    # Without DDP, rank r's gradient is 2*(r+1) per weight; DDP averages over ranks.
    expected = sum(2.0 * (r + 1) for r in range(world)) / world
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    if os.environ.get("LAUNCH_TEST_FAIL_AFTER_INIT") == os.environ.get("TORCHELASTIC_RESTART_COUNT") and rank == 1:
        raise RuntimeError("planned failure after init")
    out = Path(os.environ["LAUNCH_TEST_OUT"])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank,
        "world": world,
        "local_rank": local_rank,
        "grad": grad,
        "expected": expected,
        "all_reduce": t.item(),
        "env": dict(os.environ),
    }))
    dist.barrier()  # both ranks done with the group before either tears it down
    dist.destroy_process_group()

    # After a DDP job torch 2.13's gloo can abort in python's teardown (exit 134, docs/guide.md); skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
