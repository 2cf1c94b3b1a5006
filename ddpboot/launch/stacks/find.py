"""Finding a running job's launcher, and asking it for a dump (`ddpboot stacks`, the smoke test's timeout).

Each launcher writes `launcher.json` (its pid, run id and run directory) into its run directory, removed at the end.
Running jobs are found from their ranks: every rank's environment names its stacks file (STACKS_VAR), inside its
run directory, so this user's processes in /proc lead to the run directories and their launchers; nothing is left
behind by a launcher that was killed. `ddpboot stacks` takes a launcher pid, a run directory or a run id, or,
alone, the one job of this user that runs; it sends STACKS_SIGNAL and waits for the dump's JSON file in the run
directory.
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
from ddpboot.launch.procs.groups import signal_process

RECORD = "launcher.json"


@dataclass(frozen=True)
class RunRecord:
    pid: int
    run_id: str
    run_dir: Path

    def to_json(self) -> str:
        return json.dumps({"pid": self.pid, "run_id": self.run_id, "run_dir": str(self.run_dir)})


def write_whole(path: Path, text: str) -> None:
    """Write `text` beside `path` and rename it into place: whoever looks for the file (`ddpboot stacks`, awaiting
    a record or a dump) finds it absent or whole, never empty or cut."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def publish(record: RunRecord) -> None:
    """Write the record into the run directory (best effort: a dump works without it)."""
    with contextlib.suppress(OSError):
        write_whole(record.run_dir / RECORD, record.to_json() + "\n")


def unpublish(record: RunRecord) -> None:
    with contextlib.suppress(OSError):
        (record.run_dir / RECORD).unlink()


def _read(path: Path) -> RunRecord | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = RunRecord(int(data["pid"]), str(data["run_id"]), Path(data["run_dir"]))
        return record if record.pid > 1 else None  # a damaged file: pid 0 would signal the caller's group
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stacks_paths() -> set[Path]:
    """The stacks files (STACKS_VAR) of this user's running ranks, from /proc/PID/environ."""
    key = STACKS_VAR.encode() + b"="
    out = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(key):
                out.add(Path(item[len(key):].decode(errors="replace").partition(":")[2]))
    return out


def running() -> list[RunRecord]:
    """This user's running launchers: the run directories above their ranks' stacks files (attempt_N/, and
    round_R/ in an elastic job) that hold a live launcher's record."""
    records: dict[int, RunRecord] = {}
    for path in stacks_paths():
        for run_dir in list(path.parents)[1:3]:
            rec = _read(run_dir / RECORD)
            if rec is not None and _alive(rec.pid):
                records[rec.pid] = rec
                break
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
    if (path / RECORD).is_file():
        rec = _read(path / RECORD)
        if rec is not None and _alive(rec.pid):
            return rec
        raise UsageError(f"the job of run directory {run} is not running (its launcher has exited).")
    match = [r for r in jobs if str(r.pid) == run or r.run_id == run]
    if match:
        return match[0]
    known = ", ".join(f"pid {r.pid} / run id {r.run_id}" for r in jobs) or "none"
    raise UsageError(f"RUN {run!r} is no running ddpboot job's pid, run id or run directory (running: {known}).")


def dumps(run_dir: Path) -> set[Path]:
    return set(run_dir.glob("stacks-*.json"))


def request_dump(record: RunRecord, timeout: float) -> Path | None:
    """Send the launcher STACKS_SIGNAL; the new dump's JSON file, or None if none came within `timeout`."""
    before = dumps(record.run_dir)
    signal_process(record.pid, STACKS_SIGNAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = dumps(record.run_dir) - before
        if new:
            return max(new, key=lambda p: p.stat().st_mtime)
        if not _alive(record.pid):
            return None
        time.sleep(0.05)  # the launcher writes the file; nothing to wait on but its appearance
    return None
