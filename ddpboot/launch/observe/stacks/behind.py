"""The flight recorder's verdict (flight.py reads the dumps): in each process group, the ranks whose collectives of
one sequence number differ (a reordered or skipped collective), else the ranks whose last collective is behind
their peers' (they never called the one the others wait in), else that every rank is at the same collective. Pure.

Only the dumps there are can be compared: a member without a dump (it was ended before it wrote one, or it ran
on another node: a stack dump on node 0 has the other nodes' dumps through the store, gather.py, the failure
report only this node's) is named as missing, never as behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.stacks.flight import Call, Flight, Group, read_dir
from ddpboot.launch.observe.stacks.verdict import Verdict, ranks_text

MAX_CLAUSES = 3  # process groups named in one verdict


@dataclass(frozen=True)
class Finding:
    """What the dumps say: the text after `flight recorder: `, and the ranks it names as the ones to look at."""

    text: str
    look_at: tuple[int, ...]
    kind: str  # mismatch, behind, level (every rank at the same collective), none (nothing to compare)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.text, "look_at": list(self.look_at), "kind": self.kind}


@dataclass(frozen=True)
class _GroupFinding:
    text: str
    look_at: tuple[int, ...]
    kind: str


def judge(flight: Flight) -> Finding:
    found = [f for f in (_judge_group(name, flight) for name in _group_names(flight)) if f is not None]
    order = {"mismatch": 0, "behind": 1, "level": 2}
    found.sort(key=lambda f: order[f.kind])
    notes = [f"unreadable: {'; '.join(flight.problems)}"] if flight.problems else []
    if not found:
        what = "no collective recorded" if flight.ranks else "no dump could be read"
        return Finding("; ".join([what, *notes]), (), "none")
    kind = found[0].kind
    shown = [f for f in found if f.kind == kind][:MAX_CLAUSES] if kind != "level" else found[:MAX_CLAUSES]
    look = tuple(sorted({r for f in shown for r in f.look_at}))
    text = "; ".join([*(f.text for f in shown), *notes])
    if look:
        text += f": look at {ranks_text(look)}"
    return Finding(text, look, kind)


def _group_names(flight: Flight) -> list[str]:
    names = {n for t in flight.ranks.values() for n in t.groups}
    return sorted(names, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))


def _members(name: str, flight: Flight) -> tuple[set[int], str]:
    """The group's ranks (pg_config, else the ranks that recorded a collective of it), and its label."""
    members: set[int] = set()
    label = f"process group {name}"
    for t in flight.ranks.values():
        members.update(t.members.get(name, ()))
        if name in t.groups:
            label = t.groups[name].label()
    if not members:
        members = {r for r, t in flight.ranks.items() if name in t.groups}
    return members, label


def _judge_group(name: str, flight: Flight) -> _GroupFinding | None:
    members, label = _members(name, flight)
    groups: dict[int, Group | None] = {}
    for r in sorted(members & set(flight.ranks)):
        trace = flight.ranks[r]
        groups[r] = trace.groups.get(name) or (Group(name, "", ()) if trace.whole else None)
    known = {r: g for r, g in groups.items() if g is not None}
    missing = sorted(members - set(flight.ranks))
    if not known:
        return None
    found = _mismatch(label, known) or _behind(label, known) or _level(label, known)
    if missing and found is not None:
        note = f" (no dump from {ranks_text(missing)})"
        return _GroupFinding(found.text + note, found.look_at, found.kind)
    return found


def _mismatch(label: str, groups: dict[int, Group]) -> _GroupFinding | None:
    """The first sequence number at which the members that recorded it called different collectives."""
    by_seq: dict[int, dict[int, Call]] = {}
    for r, g in groups.items():
        for c in g.calls:
            by_seq.setdefault(c.seq, {})[r] = c
    for seq in sorted(by_seq):
        calls = by_seq[seq]
        ops = Counter(c.op for c in calls.values())
        if len(ops) < 2:
            continue
        top = ops.most_common()
        odd = () if top[0][1] == top[1][1] else tuple(sorted(r for r, c in calls.items() if c.op != top[0][0]))
        parts = "; ".join(f"{ranks_text([r for r, c in calls.items() if c.op == op])} called {op}"
                          + _sites([c for c in calls.values() if c.op == op]) for op, _ in top)
        return _GroupFinding(f"collective #{seq} of {label} differs between ranks: {parts} (a reordered or "
                             "skipped collective)", odd, "mismatch")
    return None


def _sites(calls: Sequence[Call]) -> str:
    sites = sorted({c.at for c in calls if c.at})
    return f" at {', '.join(sites)}" if sites else ""


def _behind(label: str, groups: dict[int, Group]) -> _GroupFinding | None:
    last = {r: (g.last.seq if g.last else 0) for r, g in groups.items()}
    low, high = min(last.values()), max(last.values())
    if low == high:
        return None
    slow = sorted(r for r, s in last.items() if s == low)
    ahead = sorted(r for r, s in last.items() if s > low)
    one = len(slow) == 1
    mine = groups[slow[0]].last
    theirs = next((c for c in groups[ahead[0]].calls if c.seq == low + 1), groups[ahead[0]].last)
    assert theirs is not None
    waits = _clause(ahead, groups)
    text = (f"{ranks_text(slow)} {'is' if one else 'are'} behind in {label}: "
            f"{'its' if one else 'their'} last collective is {mine.text() if mine else 'none (it called none)'}; "
            f"{waits}; {ranks_text(slow)} never called {theirs.op} #{theirs.seq}")
    return _GroupFinding(text, tuple(slow), "behind")


def _clause(ranks: Sequence[int], groups: dict[int, Group]) -> str:
    """`rank 0 is at all_reduce #5 at job.py:9 (not completed)`, one part per distinct last collective."""
    by: dict[Call, list[int]] = {}
    for r in ranks:
        last = groups[r].last
        assert last is not None
        by.setdefault(last, []).append(r)
    return "; ".join(f"{ranks_text(rs)} {'is' if len(rs) == 1 else 'are'} at {c.text()}"
                     for c, rs in sorted(by.items(), key=lambda kv: (-kv[0].seq, kv[1])))


def _level(label: str, groups: dict[int, Group]) -> _GroupFinding | None:
    lasts = {g.last for g in groups.values()}
    if None in lasts:
        return None
    seqs = {c.seq for c in lasts if c is not None}
    c = next(iter(lasts))
    assert c is not None and len(seqs) == 1
    n = len(groups)
    who = "the one rank" if n == 1 else f"all {n} ranks"
    return _GroupFinding(f"{who} of {label} {'is' if n == 1 else 'are'} at {c.op} #{c.seq}: no rank is behind "
                         "in it", (), "level")


def finding(directory: Path | None) -> Finding | None:
    """The verdict of the dumps in an attempt directory; None when it has none (or there is no directory)."""
    flight = read_dir(directory) if directory is not None else None
    return judge(flight) if flight is not None else None


def combined(verdict: Verdict, found: Finding) -> Verdict:
    """The stacks' verdict with the flight recorder's after it; the ranks the stacks name, else the dumps'."""
    return Verdict(f"{verdict.text}; flight recorder: {found.text}", verdict.look_at or found.look_at)
