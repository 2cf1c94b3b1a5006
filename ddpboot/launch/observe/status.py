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

The file's fields, all of them read by `ddpboot top` (cli/top.py):

    {"version": 1, "pid": launcher pid, "start": its start time, "run_id": ..., "node_rank": N, "host": ...,
     "attempt": N, "world_size": N, "updated": unix time of this write,
     "ranks": [{"rank": global rank, "local_rank": N, "pid": N (0: not started yet), "start": its start time,
                "gpus": [{"label": "0", "uuid": "GPU-..."}], "started": unix time or null,
                "code": exit code once reaped or null, "last_output": unix time or null,
                "bar": the last progress-bar state or null}],
     "warnings": [the GPU watch's messages, in order]}
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running
from ddpboot.launch.procs.procstat import start_of
from ddpboot.launch.rundir import RunPaths, write_whole

VERSION = 1
WRITE_INTERVAL = 1.0  # seconds between two writes at most
MAX_WARNINGS = 50  # the file stays small whatever the watch says
MAX_BAR = 200  # characters of a bar kept


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
        self.head: dict[str, Any] = {"version": VERSION, "pid": os.getpid(), "start": start_of(os.getpid()),
                                     "run_id": run_id, "node_rank": node_rank, "host": socket.gethostname(),
                                     "attempt": 0, "world_size": world_size}
        self.clock = clock
        self.wall = wall
        self.last_output: dict[int, float] = {}  # rank → wall time
        self.bars: dict[int, str] = {}  # rank → the last bar seen at a write
        self.warnings: list[str] = []
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
        self.head["attempt"] = attempt
        self.last_output.clear()
        self.bars.clear()
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

    def snapshot(self, workers: Sequence[Rank]) -> dict[str, Any]:
        ranks = []
        for w in workers:
            bar = _bar(w)
            if bar is not None:
                self.bars[w.slot.rank] = bar
            ranks.append({
                "rank": w.slot.rank, "local_rank": w.slot.local_rank, "pid": w.pid, "start": w.pid_start,
                "gpus": [{"label": g.label, "uuid": g.uuid} for g in w.slot.gpus],
                "started": self.wall() - (self.clock() - w.started) if w.pid else None,
                "code": w.code if w.status is not None else None,
                "last_output": self.last_output.get(w.slot.rank),
                "bar": self.bars.get(w.slot.rank),
            })
        return {**self.head, "updated": self.wall(), "ranks": ranks, "warnings": list(self.warnings)}

    def _write(self, workers: Sequence[Rank]) -> None:
        try:
            write_whole(self.path, json.dumps(self.snapshot(workers)) + "\n")
            self.writes += 1
        except OSError:
            self.broken = True  # best effort, as the record: the job runs on without it

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The status file of the launcher of `run_dir` as published (None: none, or not this version's)."""
    try:
        data = json.loads(RunPaths(run_dir).status.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None
