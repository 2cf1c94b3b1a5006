"""A DDP training script written the classic torchrun way, with no ddpboot in it.

    torchrun --nproc-per-node 2 examples/torchrun_style.py --epochs 3
    ddpboot --nproc 2 examples/torchrun_style.py --epochs 3

It follows the idiom of pytorch/examples' DDP tutorial: `LOCAL_RANK` picks the GPU (`set_device`, `.to`,
`device_ids`). Under ddpboot's rank isolation each worker sees only its own GPU and gets LOCAL_RANK=0, so the
idiom lands every rank on its own GPU unchanged. Without CUDA it falls back to gloo on CPU.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(2048, 1, generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    if use_cuda:
        model = model.to(local_rank)
        ddp_model = DDP(model, device_ids=[local_rank])
    else:
        ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            if use_cuda:
                xb, yb = xb.to(local_rank), yb.to(local_rank)
            loss = nn.functional.mse_loss(ddp_model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    # torch 2.13 on CPU: after a DDP job, gloo's threads outlive destroy_process_group() and can abort the process in
    # python's own teardown ("terminate called without an active exception", exit 134; docs/guide.md). Leaving
    # without that teardown, once everything is written, avoids it. (ddpboot.init() handles this by itself.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
