"""Why a rank died by a signal (why.py decides; this observer gathers the facts).

While a rank runs it reads, once at its start (before it can die): its memory cgroup (/proc/PID/cgroup) and that
cgroup's counters with those above it (memcg.py), its CPU-time limit (/proc/PID/limits) and the node's OOM kill
count; then, every SAMPLE_INTERVAL seconds, its peak resident memory (VmHWM) and CPU time. When it dies by a
signal the same counters are read again, and the kernel log's `Killed process PID` line where it can be read; at
the attempt's end (when what ddpboot sent each rank is known) why.py's sentence goes into the status file (the
summary's `why:` line, status.json's `cause`) and into the rank's error file (TORCHELASTIC_ERROR_FILE, in torch's
format) when the rank left none."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running, Status
from ddpboot.launch.observe.memcg import Counters, MemoryCgroup, kernel_kill_line, memory_cgroup, node_oom_kills
from ddpboot.launch.observe.why import Death, explain
from ddpboot.procfs import cpu_limit, peak_rss, read_stat

SAMPLE_INTERVAL = 2.0  # seconds between two samples of the ranks' peak memory and CPU time
ERROR_FILE_KEY = "ddpboot_cause"  # marks an error file ddpboot wrote (the summary does not show it as a traceback)
CRASH_MARK = "Fatal Python error"  # faulthandler's first line


@dataclass
class Watched:
    """One rank's process, as recorded from its start."""

    pid: int
    cgroup: MemoryCgroup | None
    before: tuple[Counters, ...] | None
    cpu_limit: tuple[float | None, float | None] | None
    node_ooms: int | None
    peak_rss: int | None = None
    cpu_used: float | None = None
    deaths: list[Death] = field(default_factory=list)


class DeathCause(Observer):
    def __init__(self, status: Status, clock: Callable[[], float], wall: Callable[[], float] = time.time,
                 kmsg: Callable[[int], tuple[str | None, str | None]] = kernel_kill_line) -> None:
        self.status = status
        self.clock = clock
        self.wall = wall
        self.kmsg = kmsg
        self.watched: dict[int, Watched] = {}  # rank → its process
        self.dead: list[tuple[Rank, Death]] = []
        self.next_sample = -float("inf")
        self.fresh = True  # a rank started that is not recorded yet: wake at once
        self.root: int | None = None  # the attempt's root cause: the first failure, while nothing was being stopped

    @classmethod
    def start(cls, job: Job) -> DeathCause:
        return cls(job.status, job.clock)

    def due(self, now: float) -> float | None:
        return now if self.fresh else self.next_sample

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        self.fresh = False
        sample = now >= self.next_sample
        for w in running.workers:
            if not w.pid or w.status is not None:
                continue
            seen = self.watched.get(w.slot.rank)
            if seen is None or seen.pid != w.pid:
                seen = self.watched[w.slot.rank] = self._record(w.pid)
            if sample:
                self._sample(seen)
        if sample:
            self.next_sample = now + SAMPLE_INTERVAL
        return ()

    def _record(self, pid: int) -> Watched:
        cgroup = memory_cgroup(pid)
        before = tuple(cgroup.read()) if cgroup is not None else None
        return Watched(pid, cgroup, before, cpu_limit(pid), node_oom_kills())

    def _sample(self, seen: Watched) -> None:
        peak = peak_rss(seen.pid)
        if peak is not None:
            seen.peak_rss = max(peak, seen.peak_rss or 0)
        stat = read_stat(seen.pid)
        if stat is not None:
            seen.cpu_used = stat.cpu

    def on_exit(self, worker: Rank) -> None:
        if worker.status is None or not os.WIFSIGNALED(worker.status):
            return
        seen = self.watched.get(worker.slot.rank)
        if seen is not None and seen.pid != worker.pid:
            seen = None
        after = tuple(seen.cgroup.read()) if seen is not None and seen.cgroup is not None else None
        signo = os.WTERMSIG(worker.status)
        # The kernel log is read for a SIGKILL only (the OOM killer's signal): a stop's SIGTERMs read nothing.
        line, unread = self.kmsg(worker.pid) if signo == signal.SIGKILL else (None, None)
        node = [s.peak_rss for s in self.watched.values() if s.peak_rss is not None]
        death = Death(
            rank=worker.slot.rank, signo=signo, at=self.wall(),
            before=seen.before if seen is not None else None, after=after,
            node_ooms=(seen.node_ooms if seen is not None else None, node_oom_kills()),
            peak_rss=seen.peak_rss if seen is not None else None, node_rss=sum(node) if node else None,
            ranks_on_node=len(self.watched), cpu_limit=seen.cpu_limit if seen is not None else None,
            cpu_used=seen.cpu_used if seen is not None else None, kernel_line=line, kernel_unread=unread,
            traceback=any(CRASH_MARK in ln for ln in worker.err.last_lines(200)),
        )
        self.dead.append((worker, death))

    def on_root(self, worker: Rank) -> None:
        self.root = worker.slot.rank

    def close(self) -> None:
        """The attempt is over: what ddpboot sent each rank is known (Worker.signalled); say why each died. The root
        cause was chosen while nothing was being stopped: what ddpboot sent it came after its death."""
        for worker, death in self.dead:
            sent = () if worker.slot.rank == self.root else tuple(dict.fromkeys(worker.signalled))
            verdict = explain(replace(death, sent=sent))
            if verdict is None:
                continue
            self.status.explain(worker.slot.rank, verdict.text)
            write_error_file(worker.error_file, verdict.text, death.at, 128 + death.signo)
        self.dead.clear()


def write_error_file(path: Path, text: str, at: float, code: int) -> None:
    """The rank's TORCHELASTIC_ERROR_FILE, in the format torch's @record writes, when the rank left none."""
    if path.exists():
        return
    data = {"message": {"message": f"ddpboot: {text}", "extraInfo": {"py_callstack": "", "timestamp": str(int(at))}},
            "errorCode": code, ERROR_FILE_KEY: text}
    with contextlib.suppress(OSError):
        path.write_text(json.dumps(data) + "\n", encoding="utf-8")


def written_by_ddpboot(path: Path) -> bool:
    """Whether the error file is one write_error_file wrote (not the rank's own record)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and ERROR_FILE_KEY in data
