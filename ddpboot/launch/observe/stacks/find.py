"""Finding a running job's launcher, and asking it for a dump (`ddpboot stacks`, the smoke test's timeout).

Each launcher writes `launcher.json` (its pid, its start time, run id and run directory) into its run directory,
removed at the end. Running jobs are found from their ranks: every rank's environment names its stacks file
(STACKS_VAR), inside its run directory, so this user's processes in /proc lead to the run directories and their
launchers. `ddpboot stacks` takes a launcher pid, a run directory or a run id, or, alone, the one job of this user
that runs; it sends STACKS_SIGNAL and waits for the dump's JSON file in the run directory.

A launcher killed with SIGKILL leaves its record (and status.json) behind, and the kernel gives its pid to another
process sooner or later: a record names its launcher by pid *and* start time (procstat.is_process), the signal goes
through a pidfd opened while both matched, and a record whose launcher has exited is reported as "no longer
running" and removed (when it is this user's).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ddpboot.contract import STACKS_SIGNAL, STACKS_VAR
from ddpboot.errors import UsageError
from ddpboot.launch.procs.procstat import is_process, signal_if_same
from ddpboot.launch.rundir import RunPaths, write_whole
from ddpboot.procfs import environ_values, read_stat


@dataclass(frozen=True)
class RunRecord:
    pid: int
    run_id: str
    run_dir: Path
    start: int | None = None  # the launcher's start time (/proc/PID/stat); None: not known, never signalled

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "start": self.start, "run_id": self.run_id, "run_dir": str(self.run_dir)})

    def running(self) -> bool:
        """Whether the launcher it names still runs (its pid and start time)."""
        return is_process(self.pid, self.start)


def publish(record: RunRecord) -> None:
    """Write the record into the run directory (best effort: a dump works without it)."""
    with contextlib.suppress(OSError):
        write_whole(RunPaths(record.run_dir).record, record.to_json() + "\n")


def unpublish(record: RunRecord) -> None:
    with contextlib.suppress(OSError):
        RunPaths(record.run_dir).record.unlink()


def _read(path: Path) -> RunRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        start = data.get("start")
        record = RunRecord(int(data["pid"]), str(data["run_id"]), Path(data["run_dir"]),
                           None if start is None else int(start))
        return record if record.pid > 1 else None  # a damaged file: pid 0 would signal the caller's group
    except (OSError, ValueError, KeyError, TypeError):
        return None


def no_longer_running(run_dir: Path, record: RunRecord | None) -> UsageError:
    """What to say of a run directory whose record names no running launcher; a record whose launcher has certainly
    exited is removed with the status file, when they are this user's."""
    if record is None:
        return UsageError(f"the job of run directory {run_dir} is not running (its {RunPaths.RECORD} cannot be "
                          "read).")
    if record.start is None:
        return UsageError(f"the job of run directory {run_dir} cannot be checked: its {RunPaths.RECORD} names pid "
                          f"{record.pid} without its start time (written by an older ddpboot), and that pid may be "
                          "another process by now; it is left alone.")
    removed = []
    paths = RunPaths(run_dir)
    for path in (paths.record, paths.status):
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.getuid():
                path.unlink()
                removed.append(path.name)
    cleaned = f"; its stale {' and '.join(removed)} removed" if removed else ""
    reused = f", and pid {record.pid} is now another process, left alone" if read_stat(record.pid) else ""
    return UsageError(f"that job is no longer running: the launcher of run directory {run_dir} (pid {record.pid}) "
                      f"has exited{reused}{cleaned}.")


def stacks_paths() -> set[Path]:
    """The stacks files (STACKS_VAR) of this user's running ranks, from /proc/PID/environ."""
    return {Path(value.partition(":")[2]) for value in environ_values(STACKS_VAR, os.getuid()).values()}


def running() -> list[RunRecord]:
    """This user's running launchers: the run directories of their ranks' stacks files that hold a live launcher's
    record."""
    records: dict[int, RunRecord] = {}
    for path in stacks_paths():
        rec = _read(RunPaths.of_stacks_file(path).record)
        if rec is not None and rec.running():
            records[rec.pid] = rec
    return [records[pid] for pid in sorted(records)]


def find(run: str | None) -> RunRecord:
    """The launcher RUN names (pid, run directory or run id), or the only one running; UsageError otherwise."""
    jobs = running()
    if run is None:
        if len(jobs) == 1:
            return jobs[0]
        if not jobs:
            raise UsageError("no running ddpboot job of this user was found; give RUN: the launcher's pid, its run "
                             "directory (--log-dir's run_id folder) or its run id.")
        listing = "; ".join(f"pid {r.pid} (run id {r.run_id})" for r in jobs)
        raise UsageError(f"{len(jobs)} ddpboot jobs are running: {listing}. Give one as RUN (a pid or a run id).")
    path = Path(run)
    if RunPaths(path).record.is_file():
        rec = _read(RunPaths(path).record)
        if rec is not None and rec.running():
            return rec
        raise no_longer_running(path, rec)
    match = [r for r in jobs if str(r.pid) == run or r.run_id == run]
    if match:
        return match[0]
    known = ", ".join(f"pid {r.pid} / run id {r.run_id}" for r in jobs) or "none"
    raise UsageError(f"RUN {run!r} is no running ddpboot job's pid, run id or run directory (running: {known}).")


def request_dump(record: RunRecord, timeout: float) -> Path | None:
    """Send the launcher STACKS_SIGNAL (only if the record's pid still names it); the new dump's JSON file, or None
    if none came within `timeout`."""
    before = RunPaths(record.run_dir).dumps()
    if not signal_if_same(record.pid, record.start, STACKS_SIGNAL):
        raise no_longer_running(record.run_dir, record)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = RunPaths(record.run_dir).dumps() - before
        if new:
            return max(new, key=lambda p: p.stat().st_mtime)
        if not record.running():
            return None
        time.sleep(0.05)  # the launcher writes the file; nothing to wait on but its appearance
    return None
