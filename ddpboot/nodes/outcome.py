"""How the nodes of a multi-node job learn that one of them failed, as pure decisions (nodes/link.py does the I/O).

Every node's launcher has a node link (a small process of its own) that talks to node 0's store while the ranks
run. A node whose job fails publishes a `NodeEnd` record at once: which node, which rank, its exit code, how it
ended. The others read it within a beat and stop their ranks; at the end every node names the same root cause
(`root_cause`: the earliest failure) and exits with its code. A node that cannot say so itself is noticed too:

- its launcher died (SIGKILL, a crash): its link sees its pipe close and publishes that;
- its MPI launcher is gone (`kill -9 mpirun`, a dead hydra_pmi_proxy or orted): its link sees the process end,
  publishes that, and its launcher stops its own ranks;
- its host is gone from the store (powered off, cut off, frozen): its beats stop, and node 0's link publishes it
  as lost once `LinkTiming.lost_after` passed without a beat (`Beats`);
- node 0's store is gone (node 0's host lost): every other link's requests fail; it stops its own node.

Keys live outside the workers' namespace (torch's clients put "/" before theirs): `ddpboot/link/beat/N` (a counter
node N's link adds 1 to every beat), `ddpboot/link/failures` + `ddpboot/link/failure/I` (the I-th failure record)
and `ddpboot/link/ended` + `ddpboot/link/end/I` (the I-th node whose job ended, failed or not). Node 0's launcher
keeps its store up until every node has ended or is lost (as torchrun's agents meet at an exit barrier), so that
no node mistakes the end of node 0's store for node 0's failure.

What it costs: per node and beat one ADD and one MULTI_GET (node 0: one more MULTI_GET of every node's beat), a
few dozen bytes each; with the default beat of 0.25 s that is 8 requests per second per node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ddpboot.errors import UsageError
from ddpboot.units import plural

PREFIX = "ddpboot/link"
FAILURES = f"{PREFIX}/failures"
ENDED = f"{PREFIX}/ended"
LOST_CODE = 1  # the job's exit code when a node is lost or its launcher died: no rank's code says more
DEFAULT_BEAT = 0.25  # --rdzv-conf keep_alive_interval (seconds)
DEFAULT_MISSED = 6  # --rdzv-conf keep_alive_max_attempt: beats missed before a node counts as lost
FIRST_BEAT_GRACE = 10.0  # seconds a node that passed the check-in gets for its link's first beat
EXIT_BARRIER = 300.0  # seconds node 0 keeps its store up for nodes still running (torchrun's exit barrier)


def link_key(kind: str, n: int) -> str:
    """`ddpboot/link/beat/NODE`, `ddpboot/link/failure/I`, `ddpboot/link/end/I`."""
    return f"{PREFIX}/{kind}/{n}"


@dataclass(frozen=True)
class LinkTiming:
    """How often a node link beats and how many beats a node may miss before it counts as lost."""

    beat: float = DEFAULT_BEAT
    missed: int = DEFAULT_MISSED

    @property
    def lost_after(self) -> float:
        return self.beat * self.missed


def link_timing(conf: Mapping[str, str]) -> LinkTiming:
    """--rdzv-conf keep_alive_interval=SECONDS and keep_alive_max_attempt=N (torch's c10d rendezvous names for
    its own heartbeat) for a fixed node count's node links; a bad value exits 2."""
    beat, missed = DEFAULT_BEAT, DEFAULT_MISSED
    text = conf.get("keep_alive_interval")
    if text is not None:
        try:
            beat = float(text)
        except ValueError:
            beat = -1.0
        if not 0 < beat <= 60:
            raise UsageError(f"--rdzv-conf keep_alive_interval={text}: give the seconds between two beats of a node "
                             f"(above 0, at most 60; default {DEFAULT_BEAT:g}).")
    text = conf.get("keep_alive_max_attempt")
    if text is not None:
        if not text.strip().isdecimal() or int(text) < 1:
            raise UsageError(f"--rdzv-conf keep_alive_max_attempt={text}: give how many beats a node may miss before "
                             f"it counts as lost (1 or more; default {DEFAULT_MISSED}).")
        missed = int(text)
    return LinkTiming(beat, missed)


@dataclass(frozen=True)
class NodeEnd:
    """How one node's job ended (a failure record, or the end of a node whose job ran to its end)."""

    node: int
    host: str
    code: int  # the exit code it gives the job (0: it succeeded)
    what: str  # how: "rank 1 exit code 3", "its launcher died", ...
    t: float  # wall-clock time of the event, as the node that saw it read it
    rank: int | None = None  # the global rank that failed, when a rank did
    line: str = ""  # the failed rank's last line of output, when it printed one
    by: int | None = None  # the node that published the record, when not the node itself (a lost node)
    last: bool = False  # no end record of the node will follow (its launcher died): nobody waits for it

    def encode(self) -> str:
        kept = {k: v for k, v in asdict(self).items()
                if k in ("node", "host", "code", "what", "t") or not (v is None or v == "" or v is False)}
        return json.dumps(kept, separators=(",", ":"))

    @classmethod
    def decode(cls, data: bytes | str) -> NodeEnd:
        raw = json.loads(data)
        return cls(int(raw["node"]), str(raw.get("host", "")), int(raw["code"]), str(raw["what"]), float(raw["t"]),
                   None if raw.get("rank") is None else int(raw["rank"]), str(raw.get("line", "")),
                   None if raw.get("by") is None else int(raw["by"]), bool(raw.get("last", False)))

    def where(self) -> str:
        return f"node {self.node} ({self.host})" if self.host else f"node {self.node}"


def root_cause(failures: Iterable[tuple[int, NodeEnd]]) -> NodeEnd | None:
    """The job's root cause among the failure records (index in the store, record): the earliest by its time; at
    the same time the one published first. A rank that fails because another node's rank failed first (its
    collective lost the peer) fails after it, so the earliest is the cause and the later ones are its consequences,
    as within a node (launch/supervisor/decisions.py)."""
    found = sorted(failures, key=lambda item: (item[1].t, item[0]))
    return found[0][1] if found else None


def stop_text(root: NodeEnd, ranks: int) -> str:
    """What a node says when another node's failure stops its ranks."""
    mine = f"this node's {plural(ranks, 'rank')}" if ranks > 1 else "this node's rank"
    return f"ddpboot: {root.where()} failed: {root.what}; stopping {mine} (exit code {root.code}, the root cause's)"


def summary(root: NodeEnd, node: int) -> str:
    """The job's verdict on a node whose ranks were stopped because of another node's failure."""
    lines = [f"ddpboot: the job failed on {root.where()}: {root.what}; this node ({node}) stopped its ranks, and "
             f"exits with the root cause's code {root.code}"]
    if root.line:
        lines.append(f"  last line of rank {root.rank}: {root.line}")
    if root.by is not None and root.by != root.node:
        lines.append(f"  (reported by node {root.by})")
    return "\n".join(lines)


def rank_failure(node: int, host: str, rank: int, code: int, how: str, t: float, line: str = "") -> NodeEnd:
    return NodeEnd(node, host, code, f"rank {rank} {how}", t, rank, line[-300:])


@dataclass
class Beats:
    """Node 0's view of the other nodes' beats: a node whose counter has not moved for `lost_after` seconds, over
    at least `MIN_LOOKS` of node 0's own readings (a store slow to answer delays every reading alike), is lost. A
    node that never beat gets FIRST_BEAT_GRACE (its link starts once every node has checked in)."""

    nodes: Sequence[int]
    timing: LinkTiming
    since: float  # when watching began
    seen: dict[int, int] = field(default_factory=dict)  # each node's counter when it last moved
    moved: dict[int, float] = field(default_factory=dict)  # when it last moved
    looks: dict[int, int] = field(default_factory=dict)  # readings since it last moved
    done: set[int] = field(default_factory=set)  # nodes no longer watched (ended or lost)

    MIN_LOOKS = 3

    def watched(self) -> list[int]:
        return [n for n in self.nodes if n not in self.done]

    def observe(self, counters: Mapping[int, int], now: float) -> list[tuple[int, float]]:
        """One reading of the watched nodes' counters; the nodes lost since, each with how long it was silent."""
        lost = []
        for node in self.watched():
            count = counters.get(node)
            if count is None:
                continue
            if count != self.seen.get(node, 0):
                self.seen[node], self.moved[node], self.looks[node] = count, now, 0
                continue
            self.looks[node] = self.looks.get(node, 0) + 1
            last = self.moved.get(node)
            silent = now - (last if last is not None else self.since)
            limit = self.timing.lost_after if last is not None else max(FIRST_BEAT_GRACE, self.timing.lost_after)
            if silent >= limit and self.looks[node] >= self.MIN_LOOKS:
                self.done.add(node)
                lost.append((node, silent))
        return lost


def lost_record(node: int, host: str, silent: float, by: int, t: float) -> NodeEnd:
    return NodeEnd(node, host, LOST_CODE, f"no beat from its launcher for {silent:.1f} s (its host is gone from the "
                   "store, or frozen)", t, by=by)
