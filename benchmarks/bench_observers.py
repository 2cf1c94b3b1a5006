"""The CPU cost, while a job runs, of the observers of issue 44: the death observer's sample (each rank's peak RSS
and CPU time, every 2 s) and its record at a rank's start (its memory cgroup's counters, CPU-time limit, the
node's OOM count), and the start-up observer's poll of the phases files (once a second while the ranks start), timed
in CPU seconds against real processes standing in for the ranks, and what they make as a share of one core.

    python benchmarks/bench_observers.py [--ranks 8] [--rounds 300]

torchrun watches none of this, so there is nothing to compare against: the goal is well under 0.5% of a core.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.contract import phases_file
from ddpboot.launch.logs import RankStream
from ddpboot.launch.observe.death import SAMPLE_INTERVAL, DeathCause
from ddpboot.launch.observe.startup import POLL_INTERVAL, Startup
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.spec import Std
from ddpboot.launch.supervisor.workers import Worker
from ddpboot.selection.planner import RankSlot


@dataclass
class Attempt:
    workers: list[Worker] = field(default_factory=list)
    stopping: bool = False


def timed(rounds: int, work: Callable[[], object]) -> tuple[float, float, float]:
    costs = []
    for _ in range(rounds):
        start = time.process_time()
        work()
        costs.append(time.process_time() - start)
    return statistics.median(costs), min(costs), max(costs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    run = Path(tempfile.mkdtemp(prefix="bench-observers-"))
    children = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
                for _ in range(args.ranks)]
    try:
        workers = []
        for r, child in enumerate(children):
            slot = RankSlot(rank=r, local_rank=r, gpus=(), cuda_visible_devices="", device="cpu")
            w = Worker(slot, [], {}, run / f"rank{r}.error.json", RankStream(r, Std.OUT, None, None),
                       RankStream(r, Std.ERR, None, None), pid=child.pid, started=time.monotonic())
            phases_file(str(w.error_file)).write_text(f"up {time.time()}\ntorch {time.time()}\n")
            workers.append(w)
        attempt = Attempt(workers)
        status = RunStatus(run, "bench", 0, args.ranks)
        clock = [0.0]
        death = DeathCause(status, lambda: clock[0])

        def sample() -> None:
            clock[0] += SAMPLE_INTERVAL
            death.on_wake(clock[0], attempt)

        def record() -> None:
            death.watched.clear()
            death.on_wake(clock[0], attempt)  # not due for a sample: only the records at the ranks' start

        sample()
        startup = Startup(status, lambda _: None, lambda: clock[0])

        def poll() -> None:
            clock[0] += POLL_INTERVAL
            startup.on_wake(clock[0], attempt)

        results = {"death: one sample of every rank": (timed(args.rounds, sample), SAMPLE_INTERVAL),
                   "death: the records at every rank's start": (timed(args.rounds, record), None),
                   "start-up: one poll of every rank's phases file": (timed(args.rounds, poll), POLL_INTERVAL)}
    finally:
        for child in children:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait()
    print(f"{args.ranks} ranks, median of {args.rounds}:")
    for what, ((median, low, high), every) in results.items():
        share = f"; every {every:g} s: {median / every * 100:.3f}% of a core" if every else " (once per rank start)"
        print(f"  {what}: {median * 1e3:.3f} ms CPU (min {low * 1e3:.3f}, max {high * 1e3:.3f}){share}")


if __name__ == "__main__":
    main()
