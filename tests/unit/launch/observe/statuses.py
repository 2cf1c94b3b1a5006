"""A status file as a launcher publishes it (four ranks: running, stopped, exited 3, not started yet), and readings
of their processes and GPUs: what `ddpboot top`'s rows and screen are made from in the unit tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ddpboot.launch.observe.sample import GpuReadings, ProcReading
from ddpboot.launch.observe.status import VERSION, GpuRef, RankStatus, StatusFile

BAR = "epoch 2:  57%|#####7    | 570/1000 [01:02<00:47,  9.12it/s]"


def rank(rank: int, pid: int, gpus: tuple[GpuRef, ...] = (), **extra: Any) -> RankStatus:
    entry = RankStatus(rank=rank, local_rank=rank, pid=pid, start=None, gpus=gpus, started=None, code=None,
                       last_output=None, bar=None)
    return replace(entry, **extra)


RANKS = (
    rank(0, 100, (GpuRef("0", "GPU-a"),), last_output=990.0, bar=BAR),
    rank(1, 101, (GpuRef("1", "GPU-b"),)),
    rank(2, 102, code=3, last_output=900.0, bar="done"),
    rank(3, 0),
)


def status(ranks: tuple[RankStatus, ...] = RANKS, **extra: Any) -> StatusFile:
    st = StatusFile(version=VERSION, pid=99, start=None, run_id="job-7", node_rank=1, host="node-a", attempt=2,
                    world_size=8, updated=999.5, ranks=ranks, warnings=("ddpboot: gpu watch: pid 7 is odd",))
    return replace(st, **extra)


BEFORE = {100: ProcReading(10.0, 1 << 30, "R"), 101: ProcReading(5.0, 1 << 20, "S")}
NOW = {100: ProcReading(11.5, 2 << 30, "R"), 101: ProcReading(5.0, 1 << 20, "T")}
GPUS = GpuReadings({"GPU-a": (40 << 30, 80 << 30, 93), "GPU-b": (1 << 30, 80 << 30, 0)},
                   {(0, "GPU-a"): 3 << 30}, known=True)
