"""An attempt for the observers' unit tests: a Job as the supervisor builds it, workers as the loop holds them, and
the attempt as the loop shows it (workers, stopping), on a fake clock."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpboot.contract import Isolation
from ddpboot.launch.logs import RankStream
from ddpboot.launch.observe.base import Job
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.rundir import RunPaths
from ddpboot.launch.spec import Std, Watch, WatchMode
from ddpboot.launch.supervisor.workers import Worker
from ddpboot.selection.gpu import GPU
from ddpboot.selection.planner import Plan, RankSlot
from tests.support import launch_spec


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gpu(index: int) -> GPU:
    return GPU(index=index, uuid=f"GPU-{'ab'[index]}", pci_bus_id="", name="", memory_total=0, memory_used=0)


def slot(rank: int, gpus: tuple[GPU, ...] = ()) -> RankSlot:
    return RankSlot(rank=rank, local_rank=rank, gpus=gpus, cuda_visible_devices="", device="cpu")


def worker(rank: int, pid: int, gpus: tuple[GPU, ...] = (), run: Path = Path("/run")) -> Worker:
    return Worker(slot(rank, gpus), [], {}, RunPaths(run).attempt(0).error_file(rank),
                  RankStream(rank, Std.OUT, None, None), RankStream(rank, Std.ERR, None, None), pid=pid, started=99.0)


@dataclass
class Attempt:
    """observe.base.Running."""

    workers: list[Worker] = field(default_factory=list)
    stopping: bool = False


def job(run: Path, clock: Clock, said: list[str], slots: tuple[RankSlot, ...] = (), watch: Watch | None = None,
        env: dict[str, str] | None = None, **spec: object) -> Job:
    plan = Plan(ranks=slots or (slot(0), slot(1)), world_size=len(slots) or 2, nnodes=1, node_rank=0,
                isolation=Isolation.NODE, backend="gloo")
    base = launch_spec(python="/usr/bin/python3", run_id="job-7", gpu_watch=WatchMode.WARN)
    status = RunStatus(run, "job-7", 0, plan.world_size, clock=clock, wall=lambda: 1000.0 + clock.now)
    return Job(0, replace(base, **spec), plan, RunPaths(run), False, env or dict(os.environ), 29500, said.append,
               clock, status, watch)
