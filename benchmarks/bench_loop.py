"""The attempt loop's own CPU cost: one wake-up (the timeout from the decisions and the observers' due times, then
reaping, the decisions and every observer's turn) and one read of a rank's output, timed in CPU microseconds.

    python benchmarks/bench_loop.py [--ranks 8] [--wakes 20000]

The ranks are real processes (`sleep`), every observer a job can have is on (the watch hook every 0.1 s as the node
link asks, the GPU watch on a simulated GPU per rank but not due, --stall-timeout, the stack dumps, the status
file), and select() returns at once: what is timed is the loop, not the kernel's wait. torchrun has no such loop to
compare against; the number to watch is this one across changes (an observer added must not make it grow much).
"""

from __future__ import annotations

import argparse
import math
import os
import selectors
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ddpboot.contract import Isolation
from ddpboot.launch import observe
from ddpboot.launch.logs import Console, RankStream
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.procs.signals import ForwardPolicy
from ddpboot.launch.rundir import RunPaths
from ddpboot.launch.spec import LaunchSpec, Std, Target, Watch, WatchMode
from ddpboot.launch.supervisor.decisions import AttemptDecisions, Timing
from ddpboot.launch.supervisor.loop import AttemptLoop, ProcessTable
from ddpboot.launch.supervisor.starters import ExecStarter
from ddpboot.launch.supervisor.workers import Worker
from ddpboot.selection.gpu import GPU
from ddpboot.selection.planner import Plan, RankSlot


class Ready(selectors.DefaultSelector):
    """A selector whose wait returns at once, with nothing ready."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []


class NoGuardian:
    pid = -1


def loop(ranks: int, pids: list[int], run: Path) -> AttemptLoop:
    gpus = [GPU(index=i, uuid=f"GPU-{i}", pci_bus_id="", name="", memory_total=0, memory_used=0) for i in range(ranks)]
    slots = tuple(RankSlot(rank=i, local_rank=i, gpus=(gpus[i],), cuda_visible_devices=str(i), device="cuda:0")
                  for i in range(ranks))
    plan = Plan(ranks=slots, world_size=ranks, nnodes=1, node_rank=0, isolation=Isolation.NODE, backend="gloo")
    procs = ProcessTable(NoGuardian(), ExecStarter(), time.monotonic)  # type: ignore[arg-type]
    procs.workers = [Worker(s, [], {}, RunPaths(run).attempt(0).error_file(s.rank),
                            RankStream(s.rank, Std.OUT, None, None), RankStream(s.rank, Std.ERR, None, None),
                            pid=pid, started=time.monotonic()) for s, pid in zip(slots, pids, strict=True)]
    null = os.open(os.devnull, os.O_WRONLY)
    console = Console(null, null)
    spec = LaunchSpec(target=Target("script", "train.py", ()), python="python", run_id="bench",
                      gpu_watch=WatchMode.WARN, gpu_watch_interval=1e9, stall_timeout=600.0)
    job = observe.Job(0, spec, plan, RunPaths(run), False, {}, 29500, console.message, time.monotonic,
                      RunStatus(run, "bench", 0, ranks), Watch(lambda: None, 0.1))
    decisions = AttemptDecisions(list(range(ranks)), Timing(30.0, 0.1), time.monotonic(), ForwardPolicy(),
                                 lambda i: math.inf)
    return AttemptLoop(procs, Ready(), None, console, decisions, observe.start(job))  # type: ignore[arg-type]


def cpu_us(n: int, step: Any) -> float:
    start = time.process_time()
    for _ in range(n):
        step()
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--wakes", type=int, default=20000)
    args = ap.parse_args()
    kids = [subprocess.Popen(["sleep", "1000"]) for _ in range(args.ranks)]
    try:
        with tempfile.TemporaryDirectory() as run:
            lp = loop(args.ranks, [k.pid for k in kids], Path(run))
            r, w = os.pipe()
            os.set_blocking(r, False)
            lp.pipes = {r: lp.workers[0].out}

            def wake() -> None:
                lp._wait()
                lp._after_wait()

            def line() -> None:
                os.write(w, b"step 1 loss 0.5\n")
                lp._pump(r)

            wakes = [cpu_us(args.wakes, wake) for _ in range(7)]
            lines = [cpu_us(args.wakes, line) for _ in range(7)]
    finally:
        for k in kids:
            k.kill()
            k.wait()
    print(f"attempt loop, {args.ranks} ranks, every observer on: one wake-up {statistics.median(wakes):.2f} us CPU "
          f"(median of 7 x {args.wakes}; min {min(wakes):.2f}), one line of output read "
          f"{statistics.median(lines):.2f} us (min {min(lines):.2f})")


if __name__ == "__main__":
    main()
