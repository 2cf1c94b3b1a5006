"""Patterns 9 and 10 (failing): torch's `@record` on main, ranks with live children (children.py: DataLoader
workers and an open Pool), and rank 1 raising once every rank's children are up, while rank 0 keeps training.

@record writes rank 1's traceback to its TORCHELASTIC_ERROR_FILE; the launcher must stop rank 0, exit non-zero,
name the error, and leave no process of the job behind: neither rank's children nor rank 0. `--device cuda`: nccl
on the rank's GPU (corpus_results.init_group)."""

import os
import time

import torch.distributed as dist
from children import start_children
from corpus_results import device_arg, init_group, write_result
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    init_group(device_arg())
    rank = dist.get_rank()
    _loader, _pool, facts = start_children()  # held until main ends: the children stay alive
    write_result(rank, world_size=dist.get_world_size(), error_file=os.environ.get("TORCHELASTIC_ERROR_FILE"),
                 **facts)
    dist.barrier()  # every rank's children are up and recorded
    if rank == 1:
        raise RuntimeError("corpus: rank 1 fails on purpose")
    # Rank 0 keeps "training" until the launcher stops it; it ends by itself only if nobody does.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit("corpus: rank 0 was never stopped")


if __name__ == "__main__":
    main()
