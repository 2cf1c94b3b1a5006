"""A job slow to start on one rank: rank 1 spends 8 s importing (as a package on a slow shared filesystem would
make it), and ddpboot's `start-up` line names that rank and phase.

    ddpboot --cpu --nproc 2 examples/slow_import.py
"""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("RANK") == "1":
    time.sleep(8.0)  # the slow import

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's teardown race: docs/guide.md, "Exit 134 after the last line of a gloo job"


if __name__ == "__main__":
    main()
