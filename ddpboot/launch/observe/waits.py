"""Stragglers of an NCCL job with --log-dir, by how long each rank's collectives ran on its GPU.

A rank waiting on its GPU (NCCL's host thread spins in a CUDA synchronize) uses as much CPU as the one that
computes, so straggler.py's CPU time cannot tell them apart; NCCL's flight recorder can: the launcher sets
TORCH_NCCL_ENABLE_TIMING=1 (each collective's duration_ms, from CUDA events around its kernel) and
TORCH_NCCL_DEBUG_INFO_PIPE_FILE (env.py), and asks each rank for a dump on demand by writing to its pipe
(`<attempt dir>/nccl_pipe_rank_<rank>.pipe`, which torch's heartbeat monitor reads once a second); torch writes the
dump where it writes one at a timeout (`nccl_trace_rank_<rank>`, flight.py reads it). A collective of the same
sequence number starts on every rank's GPU when that rank reached it and ends for all at once, so the rank that came
last has the shortest one, and the others' are longer by how long they waited for it (straggler.py's observer
asks, at least MIN_DUMP_INTERVAL apart).

The rule (`judge_calls`, pure): in one dump, a collective that every rank of this node completed points at the rank
whose duration was the shortest when every other rank's lasted at least RATIO times as long and GAP_MS more; the
dump points at that rank when at least MIN_CALLS new collectives were judged and SHARE of them point at it. Then,
as for the CPU (straggler.persistent), a rank every dump of a window points at is named once, again only on a
change. A dump read is removed, so that what the launcher reads after a failure (supervisor/report.py) is a dump
torch wrote then; when the collectives stopped moving between two dumps (a hang), the last is kept and no more are
asked for; the dumps asked for and not read go at the end of an attempt whose ranks all exited 0.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.launch.observe.base import Rank
from ddpboot.launch.observe.pace import RATIO, SAMPLES, persistent
from ddpboot.launch.observe.stacks.flight import Call, dump_files, load, parse

PIPE = "nccl_pipe_rank_"  # TORCH_NCCL_DEBUG_INFO_PIPE_FILE's prefix (env.py); torch adds `<rank>.pipe`
GAP_MS = 2.0  # the others' collective lasted this much longer at least ...
MIN_CALLS = 3  # ... in this many new collectives of a dump at least ...
SHARE = 0.8  # ... of which this share points at the one rank


@dataclass(frozen=True)
class Wait:
    """One collective the other ranks waited in for `rank`."""

    rank: int
    op: str
    own: float  # ms: its collective's duration
    others: float  # ms: the other ranks' median


def judge_calls(calls: Mapping[int, Mapping[tuple[str, int], Call]]) -> tuple[int | None, list[Wait]]:
    """One dump's new collectives (rank → (process group, sequence number) → the call, with its duration): the rank
    it points at, and the waits for it (None, []: none)."""
    if len(calls) < 2:
        return None, []
    common = set.intersection(*(set(c) for c in calls.values()))
    waits: list[Wait | None] = []
    for key in sorted(common):
        ms = {r: c[key].ms for r, c in calls.items()}
        if any(v is None for v in ms.values()):
            continue
        got = {r: float(v) for r, v in ms.items() if v is not None}
        fast = min(got, key=lambda r: (got[r], r))
        others = [v for r, v in got.items() if r != fast]
        slowed = min(others) >= RATIO * got[fast] and min(others) - got[fast] >= GAP_MS
        waits.append(Wait(fast, calls[fast][key].op, got[fast], statistics.median(others)) if slowed else None)
    if len(waits) < MIN_CALLS:
        return None, []
    top, n = Counter(w.rank if w is not None else None for w in waits).most_common(1)[0]
    if top is None or n < SHARE * len(waits):
        return None, []
    return top, [w for w in waits if w is not None and w.rank == top]


@dataclass(frozen=True)
class Waited:
    """A change of straggler by the collectives' waits (straggler.Change)."""

    rank: int | None
    waits: tuple[Wait, ...] = ()
    before: int | None = None

    def _mean(self, what: Callable[[Wait], float]) -> float:
        return statistics.fmean(what(w) for w in self.waits)

    def text(self, where: Callable[[int], str]) -> str:
        if self.rank is None:
            return (f"ddpboot: straggler: rank {self.before} keeps pace again (no rank was persistently slower in "
                    f"the last {SAMPLES} dumps of NCCL's flight recorder)")
        ops = ", ".join(sorted({w.op for w in self.waits}))
        return (f"ddpboot: straggler: rank {self.rank} ({where(self.rank)}) is slower than the others: in "
                f"{len(self.waits)} of its last collectives ({ops}) the other ranks waited "
                f"{self._mean(lambda w: w.others - w.own):.1f} ms on average for it (theirs lasted "
                f"{self._mean(lambda w: w.others):.1f} ms, its own {self._mean(lambda w: w.own):.1f} ms; NCCL's "
                "flight recorder)")

    def cell(self) -> str:
        return f"others wait {self._mean(lambda w: w.others - w.own):.1f} ms"


@dataclass
class WaitRule:
    """The dumps of one attempt, judged one by one: the last SAMPLES points, the straggler named, and the newest
    sequence number already judged per rank and process group."""

    points: list[tuple[int | None, list[Wait]]] = field(default_factory=list)
    named: int | None = None
    seen: dict[tuple[int, str], int] = field(default_factory=dict)

    def new_calls(self, rank: int, calls: Mapping[str, Sequence[Call]]) -> dict[tuple[str, int], Call]:
        """The completed collectives with a duration that the last dump of `rank` did not have."""
        out = {}
        for group, seq_calls in calls.items():
            for c in seq_calls:
                if c.seq > self.seen.get((rank, group), 0) and c.state == "completed" and c.ms is not None:
                    out[(group, c.seq)] = c
        return out

    def observe(self, calls: Mapping[int, Mapping[str, Sequence[Call]]]) -> Waited | None:
        """One dump of every rank (rank → process group → its calls); what changed (None: nothing)."""
        new = {r: self.new_calls(r, c) for r, c in calls.items()}
        for r, c in calls.items():
            for group, seq_calls in c.items():
                if seq_calls:
                    self.seen[(r, group)] = max(self.seen.get((r, group), 0), seq_calls[-1].seq)
        self.points = [*self.points, judge_calls(new)][-SAMPLES:]
        changed, self.named = persistent([p for p, _ in self.points], self.named)
        if changed is None:
            return None
        if self.named is None:
            return Waited(None, before=changed)
        return Waited(self.named, tuple(w for p, ws in self.points for w in ws if p == self.named))


class FlightWaits:
    """straggler.Judge for an NCCL job: each look reads the dumps the last one asked for (and removes them), judges
    them, and asks every running rank for the next through its pipe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rule = WaitRule()
        self.last: dict[int, int] = {}  # rank → its newest sequence number, for "the collectives stopped"
        self.asked = False
        self.hung = False

    def look(self, now: float, workers: Sequence[Rank]) -> Waited | None:
        if self.hung:
            return None
        ranks = [w.slot.rank for w in workers if w.pid and w.status is None]
        changed = self._read(ranks) if self.asked else None
        if not self.hung:
            for rank in ranks:
                ask(self.directory, rank)
            self.asked = True
        return changed

    def _read(self, ranks: Sequence[int]) -> Waited | None:
        files = dump_files(self.directory)
        calls: dict[int, dict[str, tuple[Call, ...]]] = {}
        for rank in ranks:
            try:
                trace = parse(rank, load(files[rank].read_bytes()))
            except (KeyError, OSError, ValueError):
                return None  # not written yet, or being written: the next look reads it
            calls[rank] = {name: g.calls for name, g in trace.groups.items()}
        newest = {r: max((c[-1].seq for c in groups.values() if c), default=0) for r, groups in calls.items()}
        if self.last and newest == self.last:
            self.hung = True  # no collective moved: keep this dump for what comes after
            return None
        self.last = newest
        for rank in ranks:
            with contextlib.suppress(OSError):
                files[rank].unlink()
        return self.rule.observe(calls)


    def tidy(self) -> None:
        """The attempt ended well: the dumps asked for and not read yet go (no timeout wrote any)."""
        for path in dump_files(self.directory).values():
            with contextlib.suppress(OSError):
                path.unlink()


def ask(directory: Path, rank: int) -> bool:
    """Ask `rank`'s torch for a dump: a byte into its pipe, never waiting (False: no pipe, or nobody reads it yet)."""
    try:
        fd = os.open(directory / f"{PIPE}{rank}.pipe", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)

