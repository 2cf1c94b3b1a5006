"""The checks `ddpboot smoke` runs inside every rank (`python -m ddpboot.smoke.rank`).

Each rank appends one JSON line per event to `$DDPBOOT_SMOKE_DIR/rank<R>.jsonl`: `{"check", "status": "start"}`
before a check and `{"check", "status": "pass"|"fail"|"skip", "detail", "figures", "seconds"}` after it, flushed at
once, so that when a collective hangs and the launcher stops the job, the driver still knows which check on which
rank never finished.

DDPBOOT_SMOKE_FAULT injects faults for ddpboot's own tests: `corrupt:RANK` makes RANK add 1 to its all_reduce
input, `hang:RANK:CHECK` makes RANK sleep forever at the start of CHECK (`hang:all:CHECK`: every rank, so that
no rank's own collective timeout ends the job and only the driver's --timeout does).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpboot.contract import GPU_UUIDS_VAR, ISOLATION_VAR, LOCAL_RANK_VAR, Isolation
from ddpboot.smoke.checks import RANK_CHECKS as CHECKS


class Skip(Exception):
    """A check that does not apply here (e.g. reduce_scatter on gloo)."""


class Recorder:
    def __init__(self, path: Path) -> None:
        self.file = path.open("a", buffering=1)

    def write(self, **event: Any) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())


ALL_RANKS = -2


def _fault() -> tuple[str, int, str]:
    spec = os.environ.get("DDPBOOT_SMOKE_FAULT", "")
    parts = spec.split(":")
    if len(parts) >= 2 and (parts[1].isdigit() or parts[1] == "all"):
        return parts[0], ALL_RANKS if parts[1] == "all" else int(parts[1]), parts[2] if len(parts) > 2 else ""
    return "", -1, ""


class Suite:
    def __init__(self, device: torch.device, backend: str, max_bytes: int) -> None:
        self.device = device
        self.backend = backend
        self.max_bytes = max_bytes
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.fault, self.fault_rank, self.fault_check = _fault()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # --- checks: return (detail, figures); raise AssertionError to fail, Skip to skip --------------------

    def mapping(self) -> tuple[str, dict[str, Any]]:
        expected = [u for u in os.environ.get(GPU_UUIDS_VAR, "").split(",") if u]
        if not torch.cuda.is_available():
            if expected and os.environ.get("DDPBOOT_FAKE_GPUS"):
                raise Skip(f"simulated GPUs ({len(expected)} planned); CUDA sees none on this machine")
            assert not expected, f"the plan gave this rank GPUs {expected} but CUDA sees none"
            return "CPU rank: no GPU visible, as planned", {"visible": 0}
        seen = []
        for i in range(torch.cuda.device_count()):
            uuid = str(torch.cuda.get_device_properties(i).uuid)
            seen.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        assert seen == expected, f"CUDA shows {seen}, the plan gave {expected}"
        return f"sees exactly {', '.join(u[:12] for u in seen)}", {"visible": len(seen), "uuids": seen}

    def _tensor(self, n: int, dtype: torch.dtype, value: float) -> torch.Tensor:
        return torch.full((n,), value, dtype=dtype, device=self.device)

    def all_reduce(self) -> tuple[str, dict[str, Any]]:
        expect = self.world * (self.world + 1) // 2
        dtypes = [torch.float32, torch.bfloat16, torch.int64]
        if self.device.type == "cuda":
            dtypes.append(torch.float16)
        done = []
        for dtype in dtypes:
            for n in (1, 1023, 1 << 18):
                t = self._tensor(n, dtype, self.rank + 1)
                if self.fault == "corrupt" and self.rank == self.fault_rank:
                    t += 1
                # Every rank's input, gathered first, names the rank at fault when the sum is wrong everywhere.
                inputs = [torch.zeros(1, dtype=torch.float64, device=self.device) for _ in range(self.world)]
                dist.all_gather(inputs, t.double().sum().reshape(1))
                dist.all_reduce(t)
                bad = (t != expect).nonzero()
                if bad.numel():
                    culprits = [r for r, v in enumerate(inputs) if v.item() != (r + 1) * n]
                    raise AssertionError(
                        f"all_reduce sum of {n} × {str(dtype)[6:]}: element {int(bad[0][0])} is "
                        f"{t[int(bad[0][0])].item()}, expected {expect}; wrong input from rank(s) "
                        f"{', '.join(map(str, culprits)) or 'none (the reduction itself is wrong)'}"
                    )
                done.append(f"{str(dtype)[6:]}×{n}")
        return f"sum exact for {len(done)} size/dtype pairs", {"cases": done}

    def broadcast(self) -> tuple[str, dict[str, Any]]:
        for src in {0, self.world - 1}:
            t = torch.arange(4096, dtype=torch.float32, device=self.device) + (1000 if self.rank == src else -1)
            dist.broadcast(t, src=src)
            assert torch.equal(t.cpu(), torch.arange(4096, dtype=torch.float32) + 1000), f"from rank {src}: wrong"
        return "from first and last rank", {}

    def all_gather(self) -> tuple[str, dict[str, Any]]:
        parts = [torch.empty(3, dtype=torch.int64, device=self.device) for _ in range(self.world)]
        dist.all_gather(parts, torch.tensor([self.rank, self.rank * 2, 7], device=self.device))
        got = [p.tolist() for p in parts]
        assert got == [[r, r * 2, 7] for r in range(self.world)], f"gathered {got}"
        return "every rank's tensor in rank order", {}

    def reduce_scatter(self) -> tuple[str, dict[str, Any]]:
        if self.backend == "gloo":
            raise Skip("gloo has no reduce_scatter")
        inp = torch.arange(self.world * 4, dtype=torch.float32, device=self.device) * (self.rank + 1)
        out = torch.empty(4, dtype=torch.float32, device=self.device)
        dist.reduce_scatter_tensor(out, inp)
        factor = self.world * (self.world + 1) // 2
        want = torch.arange(self.rank * 4, self.rank * 4 + 4, dtype=torch.float32) * factor
        assert torch.equal(out.cpu(), want), f"got {out.tolist()}, expected {want.tolist()}"
        return "sum scattered by rank", {}

    def barrier(self) -> tuple[str, dict[str, Any]]:
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()
        return "all ranks met", {"seconds": time.perf_counter() - t0}

    def ddp(self) -> tuple[str, dict[str, Any]]:
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(self.device)
        ddp = DistributedDataParallel(
            model, device_ids=[self.device.index or 0] if self.device.type == "cuda" else None
        )
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + self.rank)  # different data on every rank
        for _ in range(3):
            x = torch.randn(8, 16, generator=gen).to(self.device)
            loss = ddp(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
        sums = [torch.zeros(2, dtype=torch.float64, device=self.device) for _ in range(self.world)]
        dist.all_gather(sums, torch.stack([flat.sum(), (flat * flat).sum()]))
        values = [tuple(s.tolist()) for s in sums]
        assert all(v == values[0] for v in values), f"parameters differ across ranks after 3 steps: {values}"
        return "parameters identical on every rank after 3 steps", {"checksum": values[0][0]}

    def bandwidth(self) -> tuple[str, dict[str, Any]]:
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        elem = torch.tensor([], dtype=dtype).element_size()
        sizes, size = [], 1 << 20
        while size <= self.max_bytes:
            sizes.append(size)
            size *= 4
        if not sizes:
            sizes = [self.max_bytes]
        results = []
        for nbytes in sizes:
            t = torch.ones(max(nbytes // elem, 1), dtype=dtype, device=self.device)
            iters = 5 if self.device.type == "cuda" else 2
            dist.all_reduce(t)  # warm up
            self.sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            self.sync()
            secs = (time.perf_counter() - t0) / iters
            algbw = nbytes / secs / 1e9
            busbw = algbw * 2 * (self.world - 1) / self.world  # nccl-tests' all_reduce definition
            results.append({"bytes": nbytes, "seconds": secs, "algbw_gbps": algbw, "busbw_gbps": busbw})
        last = results[-1]
        kind = "GPU" if self.device.type == "cuda" else "CPU"
        return (
            f"{kind} busbw {last['busbw_gbps']:.1f} GB/s at {last['bytes'] / 2**20:.0f} MiB {str(dtype)[6:]}",
            {"sizes": results, "device": kind, "dtype": str(dtype)[6:]},
        )


def main() -> int:
    out = Path(os.environ["DDPBOOT_SMOKE_DIR"])
    checks = [c for c in os.environ.get("DDPBOOT_SMOKE_CHECKS", ",".join(CHECKS)).split(",") if c]
    max_bytes = int(os.environ.get("DDPBOOT_SMOKE_MAX_BYTES", str(64 << 20)))
    timeout = float(os.environ.get("DDPBOOT_SMOKE_TIMEOUT", "60"))
    rank = int(os.environ.get("RANK", "0"))
    rec = Recorder(out / f"rank{rank}.jsonl")
    use_cuda = torch.cuda.is_available() and os.environ.get(GPU_UUIDS_VAR, "") != ""
    backend = "nccl" if use_cuda else "gloo"
    rec.write(check="init", status="start", time=time.time())
    try:
        if use_cuda:
            isolation = Isolation.parse(os.environ.get(ISOLATION_VAR, Isolation.RANK.value), ISOLATION_VAR)
            gpus = len(os.environ[GPU_UUIDS_VAR].split(","))
            local = isolation.first_device(int(os.environ[LOCAL_RANK_VAR]), gpus)
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout), device_id=device)
        else:
            device = torch.device("cpu")
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        dist.barrier()
    except Exception as exc:
        rec.write(check="init", status="fail", detail=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
        return 1
    rec.write(
        check="init",
        status="pass",
        detail=f"{backend} on {device}",
        time=time.time(),
        figures={"first_collective_at": time.time(), "backend": backend, "device": str(device)},
    )
    suite = Suite(device, backend, max_bytes)
    failed = False
    for name in checks:
        fn: Callable[[], tuple[str, dict[str, Any]]] = getattr(suite, name)
        hangs_here = suite.fault_rank in (suite.rank, ALL_RANKS)
        if suite.fault == "hang" and hangs_here and suite.fault_check in ("", name):
            time.sleep(10**6)  # before "start": this rank never reaches the check, as a stuck rank would not
        rec.write(check=name, status="start")
        t0 = time.perf_counter()
        try:
            detail, figures = fn()
            status = "pass"
        except Skip as exc:
            status, detail, figures = "skip", str(exc), {}
        except Exception as exc:  # a failed check is a result, not a crash: report it and go on
            status, detail, figures = "fail", f"{type(exc).__name__}: {exc}", {"trace": traceback.format_exc()}
            failed = True
        rec.write(check=name, status=status, detail=detail, figures=figures, seconds=time.perf_counter() - t0)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    # Every result is already on disk (flushed and fsynced). Leaving without the interpreter's teardown avoids an
    # abort that torch's gloo backend occasionally hits there ("terminate called without an active exception"),
    # which would turn a passing rank into a crashed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
