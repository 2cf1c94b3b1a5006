"""Rank 1 leaves (exit 0) before a barrier that rank 0 waits in: rank 0 then fails with gloo's peer-closed error."""

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise SystemExit(0)
dist.barrier()
