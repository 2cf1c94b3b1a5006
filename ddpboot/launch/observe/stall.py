"""--stall-timeout while the job runs: its notion of progress (StallWatch, pure: samples in, "has anything moved"
out), and the observer that feeds it (`Stall`: the running ranks' CPU time from /proc, the output and exits the loop
reports, the ranks' stacks while the job is quiet) and answers Stalled.

Two ways to be stalled, both after at least the timeout without output and without a rank exiting:
- idle: for the whole timeout, no rank used BUSY of a core (or BUSY_SECONDS) between two samples nor was found
  running or waiting for a core (state R or D in /proc: on a crowded machine a working rank gets a small share).
  A rank waiting for a peer in gloo (a collective, a barrier, the store) sleeps in the kernel.
- busy but stuck: a rank can spin a core while it waits (CUDA's synchronize on a GPU with a core to spare, NCCL),
  so while the job is quiet the ranks' Python stacks are compared: quiet for half the timeout, a snapshot every
  quarter of it; the same stacks in every rank for half the timeout (two snapshots or more) and quiet for the
  whole timeout is a stall. A long, quiet step moves through the script's lines; one C++ call longer than half the
  timeout (a huge backward without a print) would not, so the timeout should exceed the longest single operation.
A snapshot that could not read every rank (no backend) never counts as "the same".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running, Stalled
from ddpboot.launch.observe.stacks.dump import fingerprint, take, targets
from ddpboot.procfs import read_stat

STALL_SAMPLE = 1.0  # seconds between CPU samples (a fifth of --stall-timeout when that is shorter)
BUSY = 0.1  # the share of a core a rank must use between samples for its CPU time to count as progress ...
BUSY_SECONDS = 0.03  # ... or this much CPU time, if less: a rank on a crowded machine gets a small share (measured:
# a gloo rank waiting in a barrier uses about 0.002 s of CPU per second, its threads' wake-ups)


@dataclass
class StallWatch:
    """--stall-timeout's view of progress: samples of output bytes and each rank's CPU seconds, and snapshots of
    the ranks' stacks (any hashable fingerprint; None when a rank could not be read)."""

    timeout: float
    last_progress: float  # output, an exit, or a busy rank
    next_sample: float
    quiet_since: float  # the last output or exit
    output: int = 0
    cpu: dict[int, float] = field(default_factory=dict)
    exited: int = 0
    next_snapshot: float | None = None
    snapshot: Hashable | None = None
    same_since: float = 0.0

    @classmethod
    def start(cls, timeout: float, now: float) -> StallWatch:
        return cls(timeout, now, now + cls.interval(timeout), now)

    @staticmethod
    def interval(timeout: float) -> float:
        return min(STALL_SAMPLE, timeout / 5)

    def observe(self, now: float, cpu: dict[int, float], output: int, exited: int, running: bool = False) -> bool:
        """One sample (CPU seconds per live worker index, total output bytes, ranks exited, whether a rank was
        running or waiting for a core); whether it shows progress since the last one."""
        elapsed = max(now - (self.next_sample - self.interval(self.timeout)), 1e-9)
        need = min(BUSY * elapsed, BUSY_SECONDS)
        busy = running or any(cpu[i] - self.cpu[i] >= need for i in cpu if i in self.cpu)
        spoke = output != self.output or exited != self.exited
        self.cpu, self.output, self.exited = dict(cpu), output, exited
        self.next_sample = now + self.interval(self.timeout)
        if spoke:
            self.quiet_since = now
            self.snapshot = self.next_snapshot = None
        if busy or spoke:
            self.last_progress = now
        return busy or spoke

    def stalled(self, now: float) -> bool:
        """Idle (no output, no exit, no busy rank) for the whole timeout."""
        return now - self.last_progress >= self.timeout

    def snapshot_due(self, now: float) -> bool:
        """Quiet for half the timeout and a quarter of it since the last snapshot: compare the stacks."""
        if now - self.quiet_since < self.timeout / 2:
            return False
        if self.next_snapshot is not None and now < self.next_snapshot:
            return False
        self.next_snapshot = now + self.timeout / 4
        return True

    def snapshot_taken(self, now: float, fingerprint: Hashable | None) -> bool:
        """A snapshot's fingerprint; whether the stacks have not moved for half the timeout while the job was
        quiet for all of it."""
        if fingerprint is None or fingerprint != self.snapshot:
            self.snapshot, self.same_since = fingerprint, now
            return False
        return now - self.same_since >= self.timeout / 2 and now - self.quiet_since >= self.timeout


def cpu_samples(workers: Sequence[Rank]) -> dict[int, tuple[float, bool]]:
    """Each running worker's CPU time (user + system, every thread) and whether its main thread is running or
    waiting for a core (state R or D), by index; the workers gone or not started are left out."""
    out = {}
    for i, w in enumerate(workers):
        stat = read_stat(w.pid) if w.pid and w.status is None else None
        if stat is not None:
            out[i] = (stat.cpu, stat.state in ("R", "D"))
    return out


class Stall(Observer):
    """--stall-timeout: a CPU sample of the running ranks when one is due, the stall checked at every wake-up, the
    ranks' stacks compared when StallWatch asks; nothing once the attempt is being stopped. `sample` and
    `fingerprint` read the ranks (cpu_samples, the stacks' fingerprint)."""

    def __init__(self, timeout: float, now: float, clock: Callable[[], float],
                 sample: Callable[[Sequence[Rank]], dict[int, tuple[float, bool]]],
                 fingerprint: Callable[[Sequence[Rank]], Hashable | None]) -> None:
        self.watch = StallWatch.start(timeout, now)
        self.clock = clock
        self.sample = sample
        self.fingerprint = fingerprint
        self.output = 0  # bytes the ranks wrote
        self.exited = 0  # ranks that exited
        self.stopped = False

    @classmethod
    def start(cls, job: Job) -> Stall | None:
        if job.spec.stall_timeout is None:
            return None

        def stacks(workers: Sequence[Rank]) -> Hashable | None:
            return fingerprint(take(targets(workers), "snapshot", job.env))

        return cls(job.spec.stall_timeout, job.clock(), job.clock, cpu_samples, stacks)

    def due(self, now: float) -> float | None:
        return None if self.stopped else self.watch.next_sample

    def on_output(self, rank: int, data: bytes) -> None:
        self.output += len(data)

    def on_exit(self, worker: Rank) -> None:
        self.exited += 1

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        if self.stopped or running.stopping:
            self.stopped = True
            return ()
        w = self.watch
        if now >= w.next_sample:
            samples = self.sample(running.workers)
            w.observe(now, {i: s[0] for i, s in samples.items()}, self.output, self.exited,
                      any(s[1] for s in samples.values()))
        if w.stalled(now):
            return self._stalled("no output, no rank exited, no rank busy on a CPU")
        if w.snapshot_due(now) and w.snapshot_taken(self.clock(), self.fingerprint(running.workers)):
            return self._stalled("no output, no rank exited, the same stacks in every rank")
        return ()

    def _stalled(self, why: str) -> Sequence[Answer]:
        self.stopped = True
        return (Stalled(self.watch.timeout, why),)
