"""One rank of a test job: exercises the whole worker API once and writes what it saw to OUTDIR/rank<R>.json.

Run it under torchrun, under a hand-made ddpboot or srun environment, or as plain python. Flags make it commit a
mistake before init() (so that a pitfall guard should fire) on chosen ranks only; the other ranks are the
"stays silent" half of the same run. The checks that need every rank (gradients, sampler shards) are compared by
the test across the JSON files.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import ddpboot
from ddpboot.errors import DdpbootError


def _env_rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _caught(fn: Any) -> tuple[Any, list[dict[str, str]]]:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        value = fn()
    kept = [
        {"category": w.category.__name__, "message": str(w.message), "file": Path(w.filename).name}
        for w in got
        if issubclass(w.category, ddpboot.DdpbootWarning)
    ]
    return value, kept


def _error(fn: Any) -> dict[str, str] | None:
    try:
        fn()
    except DdpbootError as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--set-cvd", default=None, help="RANK=VALUE: that rank sets CUDA_VISIBLE_DEVICES first")
    parser.add_argument("--strict-first", default=None, help="RANK: that rank tries init(strict=True) first")
    parser.add_argument("--cuda-first", default=None, help="RANK=INDEX: that rank uses cuda:INDEX before init()")
    parser.add_argument("--model-on", default=None, help="RANK=DEVICE: that rank builds its model on DEVICE")
    args = parser.parse_args()
    me = _env_rank()
    report: dict[str, Any] = {"pid": os.getpid()}

    def mine(spec: str | None) -> str | None:
        if spec is None:
            return None
        rank, _, value = spec.partition("=")
        return value if int(rank) == me else None

    report["context_before_init"] = _error(ddpboot.context)
    report["is_main_before_init"] = ddpboot.is_main()
    if (cvd := mine(args.set_cvd)) is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = cvd
    if (index := mine(args.cuda_first)) is not None:
        torch.cuda.set_device(int(index))
        torch.zeros(1, device="cuda")
    if args.strict_first is not None and int(args.strict_first) == me:
        report["strict_error"] = _error(lambda: ddpboot.init(strict=True))

    ctx, report["init_warnings"] = _caught(ddpboot.init)
    report["init_twice_same"] = ddpboot.init() is ctx
    report["backend_conflict"] = _error(lambda: ddpboot.init(backend="mpi"))
    report["context"] = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "node_rank": ctx.node_rank,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "gpu_uuids": list(ctx.gpu_uuids),
        "launcher": ctx.launcher,
        "is_main": ctx.is_main,
        "distributed": ctx.distributed,
    }
    report["context_is_ctx"] = ddpboot.context() is ctx
    report["is_main"] = ddpboot.is_main()
    report["env"] = {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
        )
    }
    report["dist_initialized"] = dist.is_initialized()
    if torch.cuda.is_available():
        report["current_device"] = torch.cuda.current_device()

    # wrap() + one step: the DDP gradient must be the mean of every rank's local gradient.
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model.load_state_dict(reference.state_dict())
    if (where := mine(args.model_on)) is not None:
        model = model.to(where)
    wrapped, report["wrap_warnings"] = _caught(lambda: ddpboot.wrap(model))
    report["wrapped_type"] = type(wrapped).__name__
    report["param_devices"] = sorted({str(p.device) for p in wrapped.parameters()})
    gen = torch.Generator().manual_seed(1000 + ctx.rank)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)
    loss = nn.functional.mse_loss(wrapped(x.to(ctx.device)), y.to(ctx.device))
    loss.backward()
    nn.functional.mse_loss(reference(x), y).backward()
    local = torch.cat([p.grad.flatten() for p in reference.parameters()])  # type: ignore[union-attr]
    if ctx.distributed and ctx.world_size > 1:
        src = local.to(ctx.device) if ctx.backend == "nccl" else local
        gathered = [torch.zeros_like(src) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, src)
        expected = torch.stack([g.cpu() for g in gathered]).mean(0)
    else:
        expected = local
    got = torch.cat([p.grad.flatten().cpu() for p in wrapped.parameters()])  # type: ignore[union-attr]
    report["grad_checksum"] = float(got.double().sum())
    report["grad_max_diff_from_mean"] = float((got - expected).abs().max())
    torch.optim.SGD(wrapped.parameters(), lr=0.1).step()
    report["param_checksum"] = float(sum(p.detach().double().sum().cpu() for p in wrapped.parameters()))
    report["wrap_non_module"] = _error(lambda: ddpboot.wrap([1, 2, 3]))  # type: ignore[arg-type]

    # sampler: this rank's share of a 10-item dataset
    s = ddpboot.sampler(list(range(10)), shuffle=True, seed=3)
    s.set_epoch(1)
    report["sampler"] = {"type": type(s).__name__, "indices": list(s)}

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ddpboot.print0("print0 says hi")
    report["print0_output"] = out.getvalue()

    # main_first: rank 0 writes a marker; the others must find it when their turn comes
    marker = args.outdir / "main_first.marker"
    with ddpboot.main_first():
        if ctx.is_main:
            time.sleep(0.2)  # give a wrongly released rank time to look too early
            marker.write_text("done")
        report["main_first_saw_marker"] = marker.exists()
    ddpboot.barrier()

    # load: map_location defaults to this rank's device
    path = args.outdir / f"tensor{ctx.rank}.pt"
    torch.save({"t": torch.arange(3)}, path)
    report["load_device"] = str(ddpboot.load(path)["t"].device)

    ddpboot.shutdown()
    report["dist_initialized_after_shutdown"] = dist.is_initialized()
    report["context_after_shutdown"] = _error(ddpboot.context)
    ddpboot.shutdown()  # twice is harmless

    (args.outdir / f"rank{ctx.rank}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
