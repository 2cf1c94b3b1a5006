"""Patterns 5 and 6: FSDP2 (`fully_shard`) for a few steps and DTensor on a CPU device mesh with gloo (with
`--device cuda`: on a CUDA mesh with nccl, each rank on the GPU LOCAL_RANK names, set first as the tutorial does).

`init_device_mesh(DEVICE, (world_size,))`; a tensor distributed with Shard(0), redistributed to Replicate and
gathered with full_tensor(); then a small model sharded layer by layer with fully_shard and trained for two steps,
its parameters gathered for a checksum that must not depend on the launcher."""

import os

import torch
import torch.distributed as dist
from corpus_results import checksum, device_arg, leave, write_result
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def dtensor_facts(mesh) -> dict[str, object]:  # type: ignore[no-untyped-def]
    full = torch.arange(24, dtype=torch.float32).reshape(8, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    replicated = sharded.redistribute(mesh, [Replicate()])
    return {"local_shape": list(sharded.to_local().shape),
            "replicated_equal": bool(torch.equal(replicated.to_local().cpu(), full)),
            "full_equal": bool(torch.equal(sharded.full_tensor().cpu(), full)),
            "sum": float((sharded * 2).full_tensor().sum())}


def fsdp_checksum(mesh) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    rank = dist.get_rank()
    for step in range(2):
        batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + rank)).to(mesh.device_type)
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()
    return checksum(p.full_tensor() for p in model.parameters())


def main() -> None:
    world_size = int(os.environ["WORLD_SIZE"])
    device_type = device_arg()
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh(device_type, (world_size,))
    write_result(dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend(),
                 dtensor=dtensor_facts(mesh), fsdp_checksum=fsdp_checksum(mesh))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()
