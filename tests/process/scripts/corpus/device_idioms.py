"""Patterns 1 to 4: the ways training scripts choose their device and backend, each written as the ecosystem
writes it, then a few DDP steps on the device each one chose (one process group: every idiom picks gloo on the CPU,
nccl on GPUs).

- tutorial: the torchrun tutorial, `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` when CUDA is there,
  `DDP(model, device_ids=[local_rank])` on a GPU and no device_ids on the CPU;
- rank_modulo: `device = rank % torch.cuda.device_count()`, the CPU without CUDA;
- count_check_cuda / count_check_accelerator: the examples' `if device_count() < world_size: print("Unable to
  locate sufficient ..."); exit()`, guarded the way scripts that also run without GPUs guard it (no GPU: the CPU);
- accelerator: `torch.accelerator` (is_available, current_accelerator, device_count), gloo on the CPU.

Each rank writes {idiom: {device, backend, gpu, checksum}} to $CORPUS_OUT (corpus_results.py); gpu is the UUID of
the GPU the idiom chose (None on the CPU). `--only NAME,...` runs only those idioms (each keeps its own seed): on
GPUs under ddpboot's rank isolation the count checks end the script (each rank sees one GPU), so the GPU test also
runs the others alone.
"""

import os
import sys

import torch
import torch.distributed as dist
from corpus_results import checksum, gpu_uuid, leave, write_result
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def tutorial() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def rank_modulo() -> tuple[torch.device, str]:
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count()), "nccl"
    return torch.device("cpu"), "gloo"


def count_check(count: int) -> tuple[torch.device, str]:
    world_size = int(os.environ["WORLD_SIZE"])
    if count == 0:
        return torch.device("cpu"), "gloo"
    if count < world_size:
        print(f"Unable to locate sufficient {world_size} gpus to run this example. Exiting.")
        exit()
    return torch.device("cuda", int(os.environ["LOCAL_RANK"])), "nccl"


def accelerator() -> tuple[torch.device, str]:
    if torch.accelerator.is_available():
        found = torch.accelerator.current_accelerator()
        assert found is not None
        device = torch.device(found.type, int(os.environ["LOCAL_RANK"]) % torch.accelerator.device_count())
        torch.accelerator.set_device_index(device.index)
        return device, dist.get_default_backend_for_device(device)
    return torch.device("cpu"), "gloo"


def train(device: torch.device, seed: int) -> float:
    """Three SGD steps of a small DDP model on `device`; the parameters' checksum after them."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    ddp_model = DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(3):
        batch = torch.randn(16, 8, generator=torch.Generator().manual_seed(100 * step + rank)).to(device)
        loss = ddp_model(batch).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return checksum(model.parameters())


IDIOMS = {
    "tutorial": tutorial,
    "rank_modulo": rank_modulo,
    "count_check_cuda": lambda: count_check(torch.cuda.device_count()),
    "count_check_accelerator": lambda: count_check(torch.accelerator.device_count()),
    "accelerator": accelerator,
}


def wanted() -> list[str]:
    if "--only" not in sys.argv:
        return list(IDIOMS)
    names = sys.argv[sys.argv.index("--only") + 1].split(",")
    unknown = set(names) - set(IDIOMS)
    assert not unknown, f"no idiom {sorted(unknown)}; there are {list(IDIOMS)}"
    return names


def main() -> None:
    chosen = {name: IDIOMS[name]() for name in wanted()}
    backends = {backend for _, backend in chosen.values()}
    assert len(backends) == 1, f"the idioms disagree on the backend: {chosen}"
    dist.init_process_group(backends.pop())
    idioms = {
        name: {"device": str(device), "backend": backend, "gpu": gpu_uuid(device),
               "checksum": train(device, list(IDIOMS).index(name))}
        for name, (device, backend) in chosen.items()
    }
    write_result(dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend(), idioms=idioms,
                 cuda_devices=torch.cuda.device_count(), accelerator=str(torch.accelerator.current_accelerator()))
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
    leave()
