"""Stragglers named while the job runs, with no change to the script (`--straggler-window`, default 10 s).

In a job whose ranks meet in collectives (DDP's all_reduce), one slow rank makes every rank's step as long as its
own, so the wall time of a step says nothing; what differs is how the time is spent: the slow rank computes while
the others wait for it in the collective, and a rank that waits in gloo sleeps in the kernel (about 0.002 s of CPU
a second, stall.py). So the launcher reads each running rank's CPU time from /proc (procfs, no help from the
script) every fifth of the window, and the rule (`StragglerRule`, pure: samples in, what to say out) is:

- one sample interval points at rank R when R used at least RATIO times as much CPU as every other rank and at
  least GAP of a core more (the others wait: they would have used as much had they work to do; two slow ranks are
  no straggler);
- R is the straggler when every interval of the last window (SAMPLES of them) points at R: persistently, not one
  spike. It is named once, with the average share of each over the window, and named again only when that changes:
  another rank (named), or no rank for a whole window (said once: it keeps pace again).

A rank that waits by spinning (NCCL's host thread in a CUDA synchronize with a core to spare) uses as much CPU as
the one computing, so this rule names CPU stragglers and the ranks whose host side is slow; a rank slowed on its GPU
alone is not told apart by CPU time: for an NCCL job with --log-dir, DDPBOOT_STRAGGLER_NCCL=1 judges by the
collectives' durations instead (waits.py), node by node. On several nodes node 0 compares the ranks of every
node through its store (across.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ddpboot.launch.env import STRAGGLER_NCCL_VAR
from ddpboot.launch.observe.across import Across
from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running
from ddpboot.launch.observe.pace import RATIO, SAMPLES, Change, persistent
from ddpboot.launch.observe.waits import FlightWaits
from ddpboot.procfs import read_stat

GAP = 0.2  # the straggler used RATIO times any other rank's CPU and this much of a core more
MIN_DUMP_INTERVAL = 2.0  # seconds between two dumps of NCCL's flight recorder at least (torch looks at its pipe
# once a second)


@dataclass(frozen=True)
class Named:
    """A change of straggler: `rank` (None: no rank any more, `before` was), with the window's averages."""

    rank: int | None
    share: float  # the straggler's CPU, in cores, averaged over the window (0 when rank is None)
    others: float  # the other ranks' median, averaged
    window: float  # seconds
    before: int | None = None

    def text(self, where: Callable[[int], str]) -> str:
        if self.rank is None:
            return (f"ddpboot: straggler: rank {self.before} keeps pace again (no rank was persistently slower over "
                    f"the last {self.window:.1f} s)")
        return (f"ddpboot: straggler: rank {self.rank} ({where(self.rank)}) is slower than the others: over the "
                f"last {self.window:.1f} s it computed {self.share:.0%} of the time and the other ranks "
                f"{self.others:.0%}, waiting for it (the ranks' CPU time)")

    def cell(self) -> str:
        """What `ddpboot top` and status.json say of the straggler."""
        return f"{self.share:.0%} vs {self.others:.0%}"


def leaning(shares: Mapping[int, float]) -> int | None:
    """The rank one interval points at (shares: cores of CPU each rank used), or None."""
    if len(shares) < 2:
        return None
    top = max(shares, key=lambda r: (shares[r], -r))
    rest = max(s for r, s in shares.items() if r != top)
    if shares[top] - rest >= GAP and shares[top] >= RATIO * rest:
        return top
    return None


@dataclass
class StragglerRule:
    """The samples of one attempt (cumulative CPU seconds by rank, at the loop's clock) and the straggler named."""

    last: tuple[float, dict[int, float]] | None = None
    intervals: list[tuple[float, dict[int, float]]] = field(default_factory=list)  # (seconds, shares), the newest
    named: int | None = None

    def observe(self, now: float, cpu: Mapping[int, float]) -> Named | None:
        """One sample; what to say when the straggler changed (None: nothing)."""
        got = self.interval(now, cpu)
        return None if got is None else self.add(*got)

    def interval(self, now: float, cpu: Mapping[int, float]) -> tuple[float, dict[int, float]] | None:
        """One sample: the interval since the last one (seconds, and each rank's share of a core), None for the
        first sample or no time passed."""
        before, self.last = self.last, (now, dict(cpu))
        if before is None or now <= before[0]:
            return None
        dt = now - before[0]
        return dt, {r: max(c - before[1][r], 0.0) / dt for r, c in cpu.items() if r in before[1]}

    def add(self, dt: float, shares: Mapping[int, float]) -> Named | None:
        """One interval (of this node's ranks, or node 0's of every node's); what changed (None: nothing)."""
        self.intervals = [*self.intervals, (dt, dict(shares))][-SAMPLES:]
        if len(self.intervals) < SAMPLES:
            return None
        changed, self.named = persistent([leaning(s) for _, s in self.intervals], self.named)
        if changed is None:
            return None
        return self._named(self.named) if self.named is not None else Named(None, 0.0, 0.0, self._span(),
                                                                             before=changed)

    def _span(self) -> float:
        return sum(dt for dt, _ in self.intervals)

    def _named(self, rank: int) -> Named:
        span = self._span()
        share = sum(dt * s[rank] for dt, s in self.intervals) / span
        others = sum(dt * statistics.median(v for r, v in s.items() if r != rank) for dt, s in self.intervals) / span
        return Named(rank, share, others, span)


def cpu_by_rank(workers: Sequence[Rank]) -> dict[int, float]:
    """Each running rank's CPU seconds (user + system, every thread), by global rank."""
    out = {}
    for w in workers:
        stat = read_stat(w.pid) if w.pid and w.status is None else None
        if stat is not None:
            out[w.slot.rank] = stat.cpu
    return out


Judge = Callable[[float, Sequence[Rank]], Change | None]
"""One sample of the running ranks at the loop's clock: what changed (None: nothing)."""


def by_cpu(sample: Callable[[Sequence[Rank]], dict[int, float]] = cpu_by_rank, across: Across | None = None) -> Judge:
    """The ranks' CPU time (`sample`) judged by StragglerRule: this node's, or with `across` (several nodes) every
    node's by node 0, the other nodes publishing theirs."""
    rule = StragglerRule()

    def judge(now: float, workers: Sequence[Rank]) -> Named | None:
        got = rule.interval(now, sample(workers))
        if got is None:
            return None
        shares = got[1] if across is None else across.exchange(got[1])
        return None if shares is None else rule.add(got[0], shares)

    return judge


class Stragglers(Observer):
    """A sample every window / SAMPLES seconds, judged by `judge` (the ranks' CPU time; an NCCL job with --log-dir:
    its collectives' waits, waits.py); what changed is said (and kept in status.json through `mark`)."""

    def __init__(self, every: float, now: float, judge: Judge, say: Callable[[str], None],
                 mark: Callable[[int | None, str | None], None], where: Callable[[int], str],
                 tidy: Callable[[], None] | None = None, across: Across | None = None) -> None:
        self.every = every
        self.next_sample = now
        self.judge, self.say, self.mark, self.where = judge, say, mark, where
        self.tidy = tidy  # at the end of an attempt whose every rank exited 0
        self.across = across  # several nodes: node 0 compares every node's ranks
        self.stopped = False
        self.failed = False

    @classmethod
    def start(cls, job: Job) -> Stragglers | None:
        window = job.spec.straggler_window
        if not window or (len(job.plan.ranks) < 2 and job.plan.nnodes < 2):
            return None
        slots = {s.rank: s for s in job.plan.ranks}
        node = job.plan.node_rank
        across = Across.start(job)

        def where(rank: int) -> str:
            if rank not in slots:  # another node's (node 0 compares every node's ranks)
                return f"node {across.nodes.get(rank, '?') if across is not None else '?'}"
            gpus = ", ".join(g.label for g in slots[rank].gpus)
            return f"GPU {gpus}, node {node}" if gpus else f"node {node}"

        every = window / SAMPLES
        if job.plan.backend == "nccl" and not job.temporary and job.env.get(STRAGGLER_NCCL_VAR) == "1":
            flight = FlightWaits(job.paths.attempt(job.attempt).root)  # this node's ranks
            return cls(max(every, MIN_DUMP_INTERVAL), job.clock(), flight.look, job.say, job.status.straggler, where,
                       flight.tidy)
        return cls(every, job.clock(), by_cpu(across=across), job.say, job.status.straggler, where, across=across)

    def due(self, now: float) -> float | None:
        return None if self.stopped else self.next_sample

    def on_exit(self, worker: Rank) -> None:
        self.failed = self.failed or worker.code != 0

    def close(self) -> None:
        if self.tidy is not None and not self.failed:
            self.tidy()


    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        if self.stopped or running.stopping:
            self.stopped = True
            return ()
        if now < self.next_sample:
            return ()
        self.next_sample = now + self.every
        changed = self.judge(now, running.workers)
        if changed is not None:
            self.say(changed.text(self.where))
            self.mark(changed.rank, changed.cell() if changed.rank is not None else None)
        return ()
