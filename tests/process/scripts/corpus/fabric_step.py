"""Pattern 8: Lightning Fabric with strategy="ddp", accelerator="cpu", devices=2. Started by a launcher, Fabric
must recognise torchrun's environment (TORCHELASTIC_RUN_ID and the rank variables) and join the job instead of
spawning processes of its own: each rank records the pids of its children, which must be none. `--device cuda`:
accelerator="cuda" with devices=LOCAL_WORLD_SIZE, the GPUs Fabric expects to see on the node."""

import os

import psutil
import torch
import torch.distributed as dist
from corpus_results import checksum, device_arg, leave, write_result
from lightning_fabric import Fabric
from torch import nn


def main() -> None:
    fabric = Fabric(accelerator=device_arg(), strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]))
    fabric.launch()
    torch.manual_seed(8)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    for step in range(2):
        generator = torch.Generator().manual_seed(80 + step + fabric.global_rank)
        inputs = fabric.to_device(torch.randn(8, 4, generator=generator))
        optimizer.zero_grad()
        fabric.backward(model(inputs).pow(2).mean())
        optimizer.step()
    fabric.barrier()
    write_result(fabric.global_rank, world_size=fabric.world_size, backend=dist.get_backend(),
                 environment=type(fabric.strategy.cluster_environment).__name__,
                 run_id_seen=bool(os.environ.get("TORCHELASTIC_RUN_ID")), device=str(fabric.device),
                 children=[p.pid for p in psutil.Process().children(recursive=True)],
                 checksum=checksum(model.parameters()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()
