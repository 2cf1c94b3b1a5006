"""The job's status for `ddpboot top`: a small JSON file in the run directory, rewritten while the job runs.

What another process cannot read from /proc is published here: which pid is which rank, when each rank last wrote
output, the last state of its progress bar, how it ended (the launcher reaps it), and the GPU watch's warnings. One
RunStatus serves every attempt of the launcher; as each attempt's observer (the last of the list: it publishes what
the others changed) it hears of output (`on_output`, one dict store) and exits, and looks after each wake-up
(`on_wake`); the file is rewritten (write beside and rename: a reader finds it whole) only when something changed,
and at most once per WRITE_INTERVAL seconds; a change held back makes the loop wake when it is due (`due`), so the
file is never more than an interval behind. Removed when the launcher ends, as its record (`launcher.json`) is.
A start time (clock ticks since boot, /proc/PID/stat) beside each pid names the process: after a `kill -9` the file
stays, and its pids may name other processes by the time someone reads it (procstat.is_process).

The file is one `StatusFile` (its fields, in this order, are the JSON object's), written by `to_json` and read back
by `read_status` (`ddpboot top`'s sampler, observe/sample.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running
from ddpboot.launch.procs.procstat import start_of
from ddpboot.launch.rundir import RunPaths, write_whole

VERSION = 1
WRITE_INTERVAL = 1.0  # seconds between two writes at most
MAX_WARNINGS = 50  # the file stays small whatever the watch says
MAX_BAR = 200  # characters of a bar kept


@dataclass(frozen=True)
class GpuRef:
    """One GPU of a rank, as the plan named it."""

    label: str  # "0", or "0:1" for a MIG instance
    uuid: str


@dataclass(frozen=True)
class RankStatus:
    rank: int  # the global rank
    local_rank: int
    pid: int  # 0: not started yet
    start: int | None  # its start time (procfs): the pid and this name the process
    gpus: tuple[GpuRef, ...]
    started: float | None  # unix time
    code: int | None  # its exit code once reaped
    last_output: float | None  # unix time
    bar: str | None  # the last state of its progress bar
    cause: str | None = None  # why it died by a signal (observe/death.py), once known
    phases: dict[str, float] | None = None  # its start-up's phases, seconds each (observe/startup.py), once known
    phase: str | None = None  # the start-up phase it is in now (None: not known, or its process group is up)
    straggler: str | None = None  # named the straggler (observe/straggler.py): its CPU against the others'


@dataclass(frozen=True)
class StatusFile:
    """status.json: the launcher, this node's ranks and the GPU watch's warnings (in order)."""

    version: int
    pid: int  # the launcher's
    start: int | None  # the launcher's start time
    run_id: str
    node_rank: int
    host: str
    attempt: int
    world_size: int
    updated: float  # unix time of this write
    ranks: tuple[RankStatus, ...]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the fields in their order, the records as objects, the tuples as lists."""
        return {**vars(self), "ranks": [{**vars(r), "gpus": [dict(vars(g)) for g in r.gpus]} for r in self.ranks],
                "warnings": list(self.warnings)}

    @classmethod
    def from_json(cls, data: Any) -> StatusFile | None:
        """The file as written (None: not a status file of this version, or a damaged one)."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return None
        try:
            ranks = tuple(RankStatus(**{**r, "gpus": tuple(GpuRef(**g) for g in r["gpus"])}) for r in data["ranks"])
            return cls(**{**data, "ranks": ranks, "warnings": tuple(data["warnings"])})
        except (KeyError, TypeError):
            return None


def _bar(w: Rank) -> str | None:
    """The worker's progress bar being drawn now (stderr's first: tqdm's), as text."""
    for stream in (w.err, w.out):
        if stream.bar is not None:
            return stream.bar.decode(errors="replace").strip()[:MAX_BAR]
    return None


class RunStatus(Observer):
    """The status file of one launcher (one Supervisor: a job, or an elastic round). `clock` paces the writes
    (the loop's monotonic clock); `wall` stamps what is published, as another process reads it."""

    def __init__(self, run_dir: Path, run_id: str, node_rank: int, world_size: int,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.path = RunPaths(run_dir).status
        self.pid, self.start_time = os.getpid(), start_of(os.getpid())
        self.run_id, self.node_rank, self.world_size = run_id, node_rank, world_size
        self.host = socket.gethostname()
        self.attempt = 0
        self.clock = clock
        self.wall = wall
        self.last_output: dict[int, float] = {}  # rank → wall time
        self.bars: dict[int, str] = {}  # rank → the last bar seen at a write
        self.warnings: list[str] = []
        self.causes: dict[int, str] = {}  # rank → why it died by a signal (observe/death.py)
        self.startup: dict[int, dict[str, float]] = {}  # rank → its start-up's phases (observe/startup.py)
        self.current: dict[int, str] = {}  # rank → the start-up phase it is in now
        self.slow: tuple[int, str] | None = None  # the straggler named: its rank, what top shows
        self.changed = False  # since the last write: output, an exit, a warning, a new attempt
        self.next_write = -float("inf")
        self.writes = 0
        self.broken = False  # the run directory cannot be written: stop trying

    @classmethod
    def start(cls, job: Job) -> RunStatus:
        """The attempt's observer: the launcher's one status file (`job.status`), its ranks starting over."""
        assert isinstance(job.status, RunStatus)
        job.status.begin(job.attempt)
        return job.status

    def begin(self, attempt: int) -> None:
        """A new attempt: its ranks start over."""
        self.attempt = attempt
        self.last_output.clear()
        self.bars.clear()
        self.causes.clear()
        self.startup.clear()
        self.current.clear()
        self.slow = None
        self.changed = True  # the first write comes at the loop's first wake-up, whatever the ranks do

    def on_output(self, rank: int, data: bytes) -> None:
        """`rank` wrote something just now (called for every piece read from its pipes: keep it cheap)."""
        self.last_output[rank] = self.wall()
        self.changed = True

    def on_exit(self, worker: Rank) -> None:
        self.changed = True

    def warn(self, text: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)
            self.changed = True

    def explain(self, rank: int, text: str) -> None:
        self.causes[rank] = text
        self.changed = True

    def phases(self, rank: int, table: dict[str, float]) -> None:
        self.startup[rank] = dict(table)
        self.changed = True

    def phase(self, rank: int, name: str | None) -> None:
        if self.current.get(rank) != name:
            if name is None:
                del self.current[rank]
            else:
                self.current[rank] = name
            self.changed = True

    def straggler(self, rank: int | None, text: str | None) -> None:
        self.slow = None if rank is None or text is None else (rank, text)
        self.changed = True

    def due(self, now: float) -> float | None:
        """When a change held back may be written (None: nothing to write)."""
        return self.next_write if self.changed and not self.broken else None

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        self.update(running.workers)
        return ()

    def update(self, workers: Sequence[Rank]) -> None:
        """Write the file if something changed since the last write and the interval allows it (otherwise `due`
        says when)."""
        if self.broken or not self.changed:
            return
        now = self.clock()
        if now < self.next_write:
            return
        self._write(workers)
        self.next_write, self.changed = now + WRITE_INTERVAL, False

    def snapshot(self, workers: Sequence[Rank]) -> StatusFile:
        ranks = []
        for w in workers:
            bar = _bar(w)
            if bar is not None:
                self.bars[w.slot.rank] = bar
            ranks.append(RankStatus(
                rank=w.slot.rank, local_rank=w.slot.local_rank, pid=w.pid, start=w.pid_start,
                gpus=tuple(GpuRef(g.label, g.uuid) for g in w.slot.gpus),
                started=self.wall() - (self.clock() - w.started) if w.pid else None,
                code=w.code if w.status is not None else None,
                last_output=self.last_output.get(w.slot.rank),
                bar=self.bars.get(w.slot.rank),
                cause=self.causes.get(w.slot.rank),
                phases=self.startup.get(w.slot.rank),
                phase=self.current.get(w.slot.rank),
                straggler=self.slow[1] if self.slow is not None and self.slow[0] == w.slot.rank else None,
            ))
        return StatusFile(VERSION, self.pid, self.start_time, self.run_id, self.node_rank, self.host, self.attempt,
                          self.world_size, self.wall(), tuple(ranks), tuple(self.warnings))

    def _write(self, workers: Sequence[Rank]) -> None:
        try:
            write_whole(self.path, json.dumps(self.snapshot(workers).to_json()) + "\n")
            self.writes += 1
        except OSError:
            self.broken = True  # best effort, as the record: the job runs on without it

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def read_status(run_dir: Path) -> StatusFile | None:
    """The status file of the launcher of `run_dir` as published (None: none, or not this version's)."""
    try:
        data = json.loads(RunPaths(run_dir).status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return StatusFile.from_json(data)
