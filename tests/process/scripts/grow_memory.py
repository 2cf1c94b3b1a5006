"""A 2-rank gloo job whose rank DEATH_TEST_RANK (default 1) grows its memory to DEATH_TEST_GROW_GIB (default 4)
GiB after the process group is up, touching every page, while the other ranks wait in a barrier; or, with
DEATH_TEST_SIGNAL=NAME, raises that signal on itself instead (a crash), or, with DEATH_TEST_BURN=1, spins until
the CPU-time limit it inherited ends it."""

from __future__ import annotations

import os
import signal

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == int(os.environ.get("DEATH_TEST_RANK", "1")):
        print(f"rank {rank} growing", flush=True)
        if "DEATH_TEST_BURN" in os.environ:  # burn CPU until the kernel's CPU-time limit (set on the launcher)
            while True:
                pass
        if "DEATH_TEST_SIGNAL" in os.environ:
            signal.raise_signal(signal.Signals[os.environ["DEATH_TEST_SIGNAL"]])
        held = []
        step = 64 << 20
        for _ in range(int(float(os.environ.get("DEATH_TEST_GROW_GIB", "4")) * (1 << 30)) // step):
            held.append(bytearray(b"\1" * step))  # written, so resident
    dist.barrier()


if __name__ == "__main__":
    main()
