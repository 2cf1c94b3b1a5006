"""Everything a rank can observe about how it was started, written to $FID_OUT/rankN.json; the fast-start tests run
it under exec and under --fast-start and compare. torch is imported inside main(), so spawn children that re-import
this file as __mp_main__ stay light."""

import json
import multiprocessing as mp
import os
import pickle
import random
import signal
import sys

import sibling


class Point:
    """Defined in the script: pickled by reference to __main__.Point."""

    def __init__(self, x: int) -> None:
        self.x = x


def square(x: int) -> int:
    return x * x


def pool_result(method: str) -> list[int]:
    with mp.get_context(method).Pool(1) as pool:
        return pool.map(square, [1, 2, 3])


def loader_result(method: str) -> list[int]:
    import torch
    from torch.utils.data import DataLoader

    data = list(range(8))
    out: list[int] = []
    for batch in DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context=method):
        out.extend(int(x) for x in torch.as_tensor(batch))
    return out


def main() -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    handlers = {}
    for sig in sorted(signal.valid_signals()):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        h = signal.getsignal(sig)
        handlers[int(sig)] = h if isinstance(h, int) else getattr(h, "__name__", repr(h))
    main_mod = sys.modules["__main__"]
    skip = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "DDPBOOT_STACKS")
    report = {
        "rank": dist.get_rank(),
        "allreduce": t.tolist(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "file": __file__,
        "name": __name__,
        "main_is_this": main_mod.__dict__ is globals(),
        "main_attrs": {k: repr(getattr(main_mod, k, None)) for k in ("__spec__", "__package__", "__cached__")},
        "loader": type(getattr(main_mod, "__loader__", None)).__name__,
        "sibling": sibling.VALUE,
        "pickled": type(pickle.loads(pickle.dumps(Point(3)))).__qualname__,
        "pickle_module": Point.__module__,
        "env": {k: v for k, v in os.environ.items() if k not in skip},
        "torch_threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "stdout": [sys.stdout.write_through, sys.stdout.line_buffering, type(sys.stdout.buffer).__name__],
        "stderr": [sys.stderr.write_through, sys.stderr.line_buffering],
        "handlers": handlers,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "flags": [sys.flags.optimize, sys.flags.dont_write_bytecode, sys.flags.isolated, sys.flags.safe_path
                  if hasattr(sys.flags, "safe_path") else None],
        "cuda_initialized": torch.cuda.is_initialized(),
        "pool_fork": pool_result("fork"),
        "pool_spawn": pool_result("spawn"),
        "loader_fork": loader_result("fork"),
        "loader_spawn": loader_result("spawn"),
        # Values that must differ between ranks (each process seeds itself): compared across ranks, not modes.
        "random": random.random(),
        "numpy_random": float(np.random.random()),
    }
    with open(os.path.join(os.environ["FID_OUT"], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
