"""Pattern 10: ranks that start processes of their own and leave them running: a DataLoader with num_workers=2 and
persistent_workers=True, and a multiprocessing Pool that is never closed. Both ranks return from main while their
children are alive. Each rank writes the pids of its children (alive at that moment); the test checks that none
outlives the job. failing_rank.py is the variant where the job fails while the children are alive. With
`--device cuda` the group is nccl on the rank's GPU (corpus_results.init_group)."""

import multiprocessing
import multiprocessing.pool
import os

import psutil
import torch
import torch.distributed as dist
from corpus_results import device_arg, gpu_uuid, init_group, write_result
from torch.utils.data import DataLoader, Dataset


class Pids(Dataset[torch.Tensor]):
    """Each item is the pid of the process that loaded it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(os.getpid())


def pid(_: int) -> int:
    return os.getpid()


def start_children() -> tuple[DataLoader[torch.Tensor], multiprocessing.pool.Pool, dict[str, object]]:
    """The DataLoader (its workers stay while it lives), the open Pool, and what the rank saw of its children."""
    loader = DataLoader(Pids(), batch_size=1, num_workers=2, persistent_workers=True)
    loader_pids = {int(batch.item()) for batch in loader}  # one epoch; the workers stay for the next
    pool = multiprocessing.Pool(2)
    pool_pids = set(pool.map(pid, range(8)))
    children = [p.pid for p in psutil.Process().children(recursive=True)]
    facts = {"children": children, "children_alive": all(psutil.pid_exists(p) for p in children),
             "loader_pids": sorted(loader_pids), "pool_pids": sorted(pool_pids)}
    return loader, pool, facts


def main() -> None:
    device = init_group(device_arg())
    _loader, _pool, facts = start_children()  # held until main ends: the children stay alive
    write_result(dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend(), gpu=gpu_uuid(device),
                 **facts)
    dist.barrier()
    dist.destroy_process_group()
    # return with the Pool open and the DataLoader's workers alive


if __name__ == "__main__":
    main()
