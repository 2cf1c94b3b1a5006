"""Train a small MLP on a synthetic regression task with ddpboot's worker API.

The same script runs however it is started:

    ddpboot --nproc 2 examples/train.py --steps 300
    torchrun --nproc-per-node 2 examples/train.py
    srun --ntasks-per-node=2 python examples/train.py
    python examples/train.py

On GPUs it uses NCCL and each rank's own GPU; on CPU, gloo. Rank 0 prints the loss (averaged over ranks) and the
throughput; at the end it prints `final loss X`, and every rank prints a checksum of its parameters, which must be
identical on every rank (DDP keeps the replicas in step).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddpboot

FEATURES = 16


def make_dataset(n: int, seed: int) -> TensorDataset:
    """y = sin(3·x·w) + 0.1·x0² + noise, with w fixed: nonlinear enough that the loss visibly falls over a few
    hundred steps. `seed` draws the samples only, so the training and validation sets share the function."""
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234)) / FEATURES**0.5
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.sin(3 * x @ w) + 0.1 * x[:, :1] ** 2 + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def mean_over_ranks(value: torch.Tensor, ctx: ddpboot.Context) -> float:
    """The mean of a scalar over all ranks (gloo has no AVG reduction, hence SUM / world_size)."""
    value = value.detach().clone()
    if ctx.distributed:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value.item() / ctx.world_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step (default 64)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    ctx = ddpboot.init()
    ddpboot.print0(
        f"world size {ctx.world_size} ({ctx.launcher}), backend {ctx.backend or 'none'}, rank 0 on {ctx.device}"
    )

    with ddpboot.main_first():  # where a real script would download its dataset once
        train = make_dataset(16384, args.seed)
        val = make_dataset(2048, args.seed + 1)

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = ddpboot.wrap(
        nn.Sequential(
            nn.Linear(FEATURES, 64),
            nn.ReLU(),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = ddpboot.sampler(train, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    step, epoch = 0, 0
    start = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for x, y in loader:
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 1 or step % args.log_every == 0 or step == args.steps:
                avg = mean_over_ranks(loss, ctx)  # every rank takes part: the condition is the same everywhere
                rate = step * args.batch_size * ctx.world_size / (time.perf_counter() - start)
                ddpboot.print0(f"step {step:5d}  loss {avg:.4f}  {rate:,.0f} samples/s")
            if step == args.steps:
                break
        epoch += 1

    model.eval()
    with torch.no_grad():  # the same parameters on every rank, so every rank computes the same validation loss
        final = nn.functional.mse_loss(model(val.tensors[0].to(ctx.device)), val.tensors[1].to(ctx.device))
    ddpboot.print0(f"final loss {final.item():.4f}")
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    # One write per line (end=""): the ranks may share one stream (torchrun without --tee), and print() would write
    # the text and its newline separately, letting another rank's line land between them.
    print(f"rank {ctx.rank} param checksum {checksum:.10f}\n", end="", flush=True)
    ddpboot.shutdown()


if __name__ == "__main__":
    main()
