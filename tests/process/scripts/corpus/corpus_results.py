"""What every corpus script reports: one JSON file per rank in $CORPUS_OUT, named after the script and the rank.

The test compares these files between launchers, so they hold only what must not depend on the launcher (ranks,
world size, backend, a checksum of the trained parameters), plus the pids the rank saw (its own and its children's)
for the check that nothing outlives the job.

`--device cuda` on a script's command line (tests/gpu/test_gpu_corpus.py) makes the scripts that take it run on the
GPU named by LOCAL_RANK with nccl, the torchrun tutorial's way; without it they run on the CPU with gloo."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def device_arg() -> str:
    """The script's `--device` (cpu or cuda), cpu when not given."""
    return sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"


def init_group(device_type: str) -> torch.device:
    """Join the job on `device_type`: gloo on the CPU; on CUDA set_device(LOCAL_RANK), then nccl."""
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def gpu_uuid(device: torch.device) -> str | None:
    """The physical GPU behind `device` (None on the CPU): what tells the ranks' GPUs apart across launchers."""
    return str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else None


def checksum(parameters) -> float:  # type: ignore[no-untyped-def]
    """The sum of every parameter, in float64: equal across ranks after a DDP step, and between launchers."""
    return float(sum(p.detach().double().sum().item() for p in parameters))


def write_result(rank: int, **facts: object) -> None:
    name = Path(sys.argv[0]).stem
    data = {"script": name, "rank": rank, "pid": os.getpid(), "local_rank_env": os.environ.get("LOCAL_RANK"), **facts}
    out = Path(os.environ["CORPUS_OUT"])
    tmp = out / f".{name}.rank{rank}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.rename(out / f"{name}.rank{rank}.json")  # whole or absent: the test never reads a half-written file


def leave() -> None:
    """End the rank without python's teardown, once everything is written and the group destroyed.

    After a DDP (or FSDP, accelerate, Fabric) job on gloo, torch 2.13 can abort in python's teardown ("terminate
    called without an active exception", exit 134): the group's threads outlive destroy_process_group() and one may
    still need the GIL while python finalizes (docs/guide.md). That is torch's, under either launcher, and would make
    these launcher comparisons flaky; leaving with os._exit skips the teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
