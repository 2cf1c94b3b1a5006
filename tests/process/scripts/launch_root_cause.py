"""Rank 1 fails (`exit`: sys.exit(3); `raise`: an uncaught exception; `crash`: os._exit(7), no teardown at all)
while rank 0 waits in a collective, and (but for `crash`), by an
atexit handler that runs after ddpboot's own (which destroys the process group), stays alive until rank 0 has died
of the broken collective: rank 0's exit always reaches the launcher first. The launcher must still name rank 1 as
the root cause and exit with its code."""

import atexit
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ddpboot

OUT = Path(os.environ["LAUNCH_TEST_OUT"])


def linger_until_rank0_is_gone() -> None:
    pid = int((OUT / "pid0").read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.01)


if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    if rank == 1:
        atexit.register(linger_until_rank0_is_gone)  # registered first, so it runs after ddpboot's shutdown
    ctx = ddpboot.init()
    if rank == 0:
        (OUT / "pid0").write_text(str(os.getpid()))
    t = torch.ones(1)
    dist.all_reduce(t)  # both ranks are up
    if rank == 1:
        if sys.argv[1] == "crash":  # no teardown and no mark: gone at once
            os._exit(7)
        if sys.argv[1] == "exit":
            sys.exit(3)
        raise ValueError("rank 1 is the root cause")
    dist.all_reduce(t)  # rank 0 waits here; rank 1 never comes
