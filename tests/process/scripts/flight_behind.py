"""A gloo job whose rank 1 falls behind: both ranks run two all_reduces and a broadcast, then rank 1 waits for
rank 0 to give up while rank 0 calls a third all_reduce that times out (init_process_group's timeout: 3 s).
Gloo's ranks record their collectives in torch's flight recorder (TORCH_FR_BUFFER_SIZE, set by the launcher with
--log-dir) but have no watchdog to dump them, so each rank writes torch's own dump (`_dump_fr_trace()`, the bytes
NCCL's watchdog writes) where the launcher told NCCL to (TORCH_FR_DUMP_TEMP_FILE + rank, on the rank's own node)
and says so in the job's store, as NCCL's watchdog does: rank 0 when its all_reduce timed out, rank 1 once rank 0
has dumped. Rank 0 then exits 1, once rank 1 has dumped (tests/process/test_hangs.py). `reorder`: rank 1 calls a
broadcast where rank 0 calls its third all_reduce. `hold`: rank 0 sleeps instead of exiting once both have dumped
(a dump on demand then reads them)."""

import contextlib
import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
from torch.distributed.distributed_c10d import _get_default_store


def dump(rank: int) -> None:
    """Write this rank's dump whole, then say so in the store (the peer may run on another node)."""
    path = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank))
    path.with_suffix(".tmp").write_bytes(_dump_fr_trace())
    path.with_suffix(".tmp").rename(path)
    _get_default_store().set(f"fr_dumped_{rank}", "1")


def await_dump(rank: int, seconds: float) -> None:
    with contextlib.suppress(RuntimeError):  # it did not dump in time: go on as NCCL's rank does
        _get_default_store().wait([f"fr_dumped_{rank}"], datetime.timedelta(seconds=seconds))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank, t = dist.get_rank(), torch.ones(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    dist.broadcast(t, 0)  # <- broadcast
    if rank == 1:
        if sys.argv[1:] == ["reorder"]:
            with contextlib.suppress(RuntimeError):  # it times out: rank 0 runs an all_reduce
                dist.broadcast(t, 0)  # <- reorder
        await_dump(0, 600)
        dump(1)
        time.sleep(600)  # ended by the launcher when rank 0 fails
    try:
        dist.all_reduce(t)  # <- behind: rank 1 never calls it
    except RuntimeError as exc:
        print(f"rank 0: {type(exc).__name__}: timed out", flush=True)
        dump(0)
        await_dump(1, 30)  # NCCL's rank also waits before it aborts (TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC)
        if sys.argv[1:] == ["hold"]:
            time.sleep(600)
        sys.exit(1)


if __name__ == "__main__":
    main()
