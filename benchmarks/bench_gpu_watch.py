"""The CPU cost of --gpu-watch: one look (NVML's compute processes of every GPU, and the process table) timed in
CPU seconds, and what that makes per minute at the default interval, as a share of one core.

    python benchmarks/bench_gpu_watch.py [--looks 200] [--interval 5]

Needs NVML (a GPU machine), or DDPBOOT_FAKE_GPUS pointing to a JSON inventory (then the simulated reading is timed).
torchrun has no such watch, so there is nothing to compare against: the goal is under 0.5% of a core.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

from ddpboot.launch.observe.gpuwatch import GpuWatch
from ddpboot.launch.spec import WatchMode
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.planner import make_plan
from ddpboot.selection.request import Request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--looks", type=int, default=200)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    inventory = load_inventory()
    plan = make_plan(Request(nproc=1), inventory, dict(os.environ), allowed_cpus=sorted(os.sched_getaffinity(0)))
    said: list[str] = []
    watch = GpuWatch(WatchMode.WARN, plan, dict(os.environ), None, said.append)
    pids = {plan.ranks[0].rank: os.getpid()}  # this process stands in for the rank
    watch.check(pids)  # the first look opens the NVML session
    costs = []
    for _ in range(args.looks):
        start = time.process_time()
        watch.check(pids)
        costs.append(time.process_time() - start)
    watch.close()
    per_look = statistics.median(costs)
    share = per_look / args.interval * 100
    print(f"gpu watch on {socket.gethostname()} ({len(inventory.gpus)} GPUs, {inventory.source}): one look "
          f"{per_look * 1e3:.2f} ms CPU (median of {args.looks}; min {min(costs) * 1e3:.2f}, max "
          f"{max(costs) * 1e3:.2f}); every {args.interval:g} s that is {share:.3f}% of a core "
          f"({per_look * 60 / args.interval * 1e3:.1f} ms CPU per minute)")
    for line in said:
        print("  said:", line)


if __name__ == "__main__":
    main()
