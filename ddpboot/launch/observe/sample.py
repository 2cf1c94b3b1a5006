"""`ddpboot top`'s readings of a running job: its launcher's status file (status.py) with a look at each rank's
process (/proc, through procfs) and GPUs (NVML, or DDPBOOT_FAKE_GPUS, read as the GPU watch reads them), made into
one row per rank; cli/top.py only lays the rows out and draws them.

`build_rows` is pure (a status, process readings, GPU readings and the time in, rows out); the readers
(`read_process`, `GpuSampler`, `Sampler`) are thin.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.status import RankStatus, StatusFile, read_status
from ddpboot.procfs import read_stat


@dataclass(frozen=True)
class ProcReading:
    """One look at a process: its CPU seconds (user + system, every thread), resident memory and state letter."""

    cpu: float
    rss: int
    state: str


def read_process(pid: int, start: int | None = None) -> ProcReading | None:
    """From /proc/PID/stat; None when gone, not started (pid 0), or not the process that started at `start`."""
    stat = read_stat(pid)
    if stat is None or (start is not None and stat.start != start):
        return None
    return ProcReading(stat.cpu, stat.rss, stat.state)


@dataclass(frozen=True)
class GpuUse:
    """One GPU of a rank: the rank's processes' memory on it, and the whole GPU's memory and utilisation."""

    label: str
    uuid: str
    used: int | None = None  # bytes the rank's processes hold on it (None: unknown)
    memory_used: int | None = None
    memory_total: int | None = None
    utilization: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "uuid": self.uuid, "used_memory": self.used, "memory_used": self.memory_used,
                "memory_total": self.memory_total, "utilization": self.utilization}


@dataclass(frozen=True)
class Row:
    rank: int
    local_rank: int
    node: int
    pid: int
    state: str
    cpu: float | None  # percent of one core
    rss: int | None
    gpus: tuple[GpuUse, ...] = ()
    quiet: float | None = None  # seconds since its last output (None: no output yet)
    bar: str | None = None
    phase: str | None = None  # the start-up phase it is in (observe/startup.py), while it starts
    straggler: str | None = None  # named the straggler: its CPU against the others' (observe/straggler.py)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "node": self.node, "pid": self.pid,
                "state": self.state, "cpu_percent": None if self.cpu is None else round(self.cpu, 1),
                "rss": self.rss, "gpus": [g.to_json() for g in self.gpus],
                "since_output": None if self.quiet is None else round(self.quiet, 1), "progress": self.bar,
                "phase": self.phase,
                "straggler": self.straggler}


@dataclass(frozen=True)
class GpuReadings:
    """The machine's GPUs by UUID (memory used, total, utilisation) and which bytes each pid holds where."""

    gpus: Mapping[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    held: Mapping[tuple[int, str], int] = field(default_factory=dict)  # (rank, uuid) → bytes of its processes
    known: bool = False  # False: not read (no GPU in the job, or NVML failed)


def state_of(entry: RankStatus, proc: ProcReading | None) -> str:
    """What can be known from outside the launcher: not started, reaped with a code, gone, stopped or running."""
    if not entry.pid:
        return "starting"
    if entry.code is not None:
        return f"exited {entry.code}"
    if proc is None or proc.state in ("Z", "X"):
        return "exited"
    if proc.state in ("T", "t"):
        return "stopped"
    return "running"


def cpu_percent(before: ProcReading | None, now: ProcReading | None, elapsed: float) -> float | None:
    if before is None or now is None or elapsed <= 0:
        return None
    return max(now.cpu - before.cpu, 0.0) / elapsed * 100


def build_rows(status: StatusFile, before: Mapping[int, ProcReading | None],
               now: Mapping[int, ProcReading | None], elapsed: float, gpus: GpuReadings, wall: float) -> list[Row]:
    """The table's rows: the status's ranks, with the process readings (by pid, `elapsed` seconds apart) and the
    GPU readings, at unix time `wall`."""
    rows = []
    for entry in status.ranks:
        proc = now.get(entry.pid)
        state = state_of(entry, proc)
        alive = state in ("running", "stopped")
        uses = []
        for g in entry.gpus:
            used, total, util = gpus.gpus.get(g.uuid, (None, None, None))
            held = gpus.held.get((entry.rank, g.uuid), 0 if gpus.known and alive else None)
            uses.append(GpuUse(g.label, g.uuid, held, used, total, util))
        last = entry.last_output
        rows.append(Row(
            rank=entry.rank, local_rank=entry.local_rank, node=status.node_rank, pid=entry.pid, state=state,
            cpu=cpu_percent(before.get(entry.pid), proc, elapsed) if alive else None,
            rss=proc.rss if alive and proc is not None else None, gpus=tuple(uses),
            quiet=max(wall - last, 0.0) if last is not None else None, bar=entry.bar,
            phase=entry.phase if alive else None,
            straggler=entry.straggler,
        ))
    return rows


def snapshot_json(status: StatusFile, rows: list[Row], wall: float) -> dict[str, Any]:
    """`ddpboot top --json`: the job and its rows (docs/reference.md)."""
    return {"run_id": status.run_id, "launcher_pid": status.pid, "host": status.host, "node_rank": status.node_rank,
            "attempt": status.attempt, "world_size": status.world_size,
            "status_age": round(max(wall - status.updated, 0.0), 1),
            "ranks": [r.to_json() for r in rows], "warnings": list(status.warnings)}


class GpuSampler:
    """The GPUs' memory and utilisation and their processes, read the way the GPU watch reads them: the simulated
    inventory when DDPBOOT_FAKE_GPUS is set, else NVML (one session for the processes, kept open)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.reader: Any = None  # selection.activity.GpuReader, made at the first reading
        self.failed: str | None = None

    def read(self, status: StatusFile) -> GpuReadings:
        from ddpboot.launch.observe.gpuwatch import RankGpus, owners
        from ddpboot.launch.procs import leftovers
        from ddpboot.selection.activity import GpuReader
        from ddpboot.selection.inventory import load_inventory

        ranks = [RankGpus(e.rank, e.pid, frozenset(g.uuid for g in e.gpus), "") for e in status.ranks
                 if e.pid and e.gpus]
        if not ranks or self.failed is not None:
            return GpuReadings()
        try:
            inventory = load_inventory(self.env)
            self.reader = self.reader or GpuReader(self.env)
            procs = self.reader.processes()
        except Exception as exc:  # InventoryError, ImportError, NVMLError (no common base to name)
            self.failed = str(exc)
            return GpuReadings()
        gpus = {u.uuid: (u.memory_used, u.memory_total, u.utilization) for u in inventory.units()}
        table = leftovers.snapshot()
        owner = owners(table, ranks, None)
        held: dict[tuple[int, str], int] = {}
        for p in procs:
            if p.pid in owner:
                key = (ranks[owner[p.pid]].rank, p.uuid)
                held[key] = held.get(key, 0) + (p.used or 0)
        return GpuReadings(gpus, held, known=True)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def _readings(status: StatusFile) -> dict[int, ProcReading | None]:
    """The running ranks' processes, by pid (each checked against its start time, where the file has one)."""
    return {e.pid: read_process(e.pid, e.start) for e in status.ranks if e.pid and e.code is None}


def await_status(run_dir: Path, alive: Callable[[], bool], timeout: float) -> StatusFile | None:
    """The launcher's status file: written at its first wake-up after the ranks start, so a job found by its ranks
    has one at once, or within `timeout` while `alive()` (its launcher runs); None: it ended, or predates it."""
    deadline = time.monotonic() + timeout
    while (status := read_status(run_dir)) is None and alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # the launcher writes the file; nothing to wait on but its appearance
    return status


class Sampler:
    """Rows from the status and two looks at the ranks' processes: the previous one (the CPU % is over the time
    between them) and now."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.gpus = GpuSampler(env)
        self.before: dict[int, ProcReading | None] = {}
        self.at = time.monotonic()

    def look(self, status: StatusFile) -> None:
        self.before, self.at = _readings(status), time.monotonic()

    def rows(self, status: StatusFile) -> list[Row]:
        now = _readings(status)
        at = time.monotonic()
        rows = build_rows(status, self.before, now, at - self.at, self.gpus.read(status), time.time())
        self.before, self.at = now, at
        return rows

    def close(self) -> None:
        self.gpus.close()


def sample_once(status: StatusFile, interval: float, env: Mapping[str, str]) -> list[Row]:
    """One snapshot's rows, the CPU % measured over `interval` seconds."""
    sampler = Sampler(env)
    try:
        sampler.look(status)
        time.sleep(interval)  # the CPU % is measured over this time
        return sampler.rows(status)
    finally:
        sampler.close()
