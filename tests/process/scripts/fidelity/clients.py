"""The accelerate and Lightning (Fabric) clients under the launcher: `clients.py accelerate|lightning`. Each writes
what the library understood of the job (ranks, world, device) and a collective's result to $FID_OUT."""

import json
import os
import sys


def with_accelerate() -> dict[str, object]:
    import torch
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    gathered = acc.gather(torch.tensor([acc.process_index + 1.0]))
    return {"rank": acc.process_index, "world": acc.num_processes, "local_rank": acc.local_process_index,
            "device": str(acc.device), "distributed": str(acc.distributed_type), "result": gathered.tolist()}


def with_lightning() -> dict[str, object]:
    import torch
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp")
    fabric.launch()
    total = fabric.all_reduce(torch.tensor([fabric.global_rank + 1.0]), reduce_op="sum")
    return {"rank": fabric.global_rank, "world": fabric.world_size, "local_rank": fabric.local_rank,
            "device": str(fabric.device), "result": total.tolist()}


if __name__ == "__main__":
    import torch.distributed as dist

    report = with_accelerate() if sys.argv[1] == "accelerate" else with_lightning()
    with open(os.path.join(os.environ["FID_OUT"], f"{sys.argv[1]}{os.environ['RANK']}.json"), "w") as f:
        json.dump(report, f)
    # Neither library tears the group down by itself; a gloo group left to the interpreter's exit sometimes aborts
    # there (torch 2.13 CPU: "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()

    # After a DDP job torch 2.13's gloo can abort in python's teardown (exit 134, docs/guide.md); skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
