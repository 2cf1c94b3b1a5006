"""The verdict of a stack dump: which rank to look at first. Pure.

The ranks are grouped by where they are (summary.Wait: what they wait in and the script's line). A hang between
ranks is almost always one rank that is not where its peers are: in the data loader while the others wait in an
all_reduce, in another collective (a call skipped or reordered), gone (it exited while the others wait for it, in
destroy_process_group or a collective). So the verdict names, in this order:

1. ranks that exited while the others wait in torch.distributed (a teardown hang when they wait in
   destroy_process_group): the ones that left;
2. ranks in no torch.distributed call while others wait in one: those;
3. ranks in another collective, or at another line, than the largest group: those (a tie names no one);
4. ranks whose stack could not be read, when nothing else stands out.

All ranks in one collective at one line, none elsewhere: nobody here is the odd one; on a node that holds only some
of the job's ranks the others are on other nodes (look there), otherwise likely a network or peer-node problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddpboot.launch.observe.stacks.summary import Wait


@dataclass(frozen=True)
class Seen:
    """A running rank at the dump: where it is (None: its stack could not be read)."""

    rank: int
    wait: Wait | None
    node: int | None = None  # the node it runs on, in a verdict over several nodes (gather.py)


@dataclass(frozen=True)
class Left:
    """A rank of the attempt that had exited at the dump."""

    rank: int
    code: int
    at: str  # the wall-clock time it exited, `12:01:03`
    ago: float  # seconds before the dump
    node: int | None = None


@dataclass(frozen=True)
class Verdict:
    text: str  # the line after `ddpboot: verdict: `
    look_at: tuple[int, ...]  # the ranks named as the ones to look at (empty: none singled out)


def ranks_text(ranks: Iterable[int]) -> str:
    """`rank 3`, `ranks 1-3`, `ranks 0, 2, 5-7`."""
    nums = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if j == i else f"{nums[i]}, {nums[j]}" if j == i + 1 else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ("rank " if len(nums) == 1 else "ranks ") + ", ".join(parts)


def place(w: Wait) -> str:
    """`all_reduce at train.py:88`, `synchronize (waiting for the GPU) after all_reduce at hang.py:11`,
    `data.py:40 (in load)`."""
    if not w.in_distributed:
        return f"{w.at} (in {w.function})" if w.at else "no Python frame"
    what = w.what + (f" after {w.after}" if w.after else "")
    return f"{what} at {w.at}" if w.at else what


def _groups(seen: Sequence[Seen]) -> list[tuple[Wait, list[int]]]:
    """Ranks by place, the largest group first (then by first rank)."""
    by: dict[tuple[str, str, str, str], tuple[Wait, list[int]]] = {}
    for s in seen:
        assert s.wait is not None
        key = (s.wait.kind, s.wait.what, s.wait.after, s.wait.at)
        by.setdefault(key, (s.wait, []))[1].append(s.rank)
    return sorted(by.values(), key=lambda g: (-len(g[1]), min(g[1])))


def _wait_clause(groups: Sequence[tuple[Wait, list[int]]], waited: bool = False) -> str:
    verb = ("has waited", "have waited") if waited else ("waits", "wait")
    return "; ".join(f"{ranks_text(r)} {verb[len(r) > 1]} in {place(w)}" for w, r in groups)


def _elsewhere_clause(groups: Sequence[tuple[Wait, list[int]]]) -> str:
    return "; ".join(f"{ranks_text(r)} {'is' if len(r) == 1 else 'are'} in {place(w)}" for w, r in groups)


def _left_clause(left: Sequence[Left]) -> str:
    return "; ".join(f"{ranks_text([x.rank])} exited {x.code} at {x.at}" for x in sorted(left, key=lambda x: x.rank))


def judge(seen: Sequence[Seen], left: Sequence[Left] = (), world_size: int | None = None,
          silent: Sequence[int] = ()) -> Verdict:
    """The verdict for the running ranks `seen`, the attempt's ranks that exited (`left`), and the job's world size
    (None: unknown; more than the ranks here: the others run on other nodes), with the node of each rank named
    when known, and the nodes whose ranks are missing because they did not answer (`silent`)."""
    verdict = _judge(seen, left, world_size)
    nodes = {x.rank: x.node for x in seen if x.node is not None} | {x.rank: x.node for x in left if x.node is not None}
    text = verdict.text
    on = sorted({nodes[r] for r in verdict.look_at if r in nodes})
    if on:
        text += "; " + "; ".join(
            _on_node([r for r in verdict.look_at if nodes.get(r) == n], n) for n in on)
    if silent:
        text += (f"; no answer from node{'s' if len(silent) > 1 else ''} {', '.join(map(str, sorted(silent)))} "
                 "(run ddpboot stacks there)")
    return Verdict(text, verdict.look_at)


def _on_node(ranks: list[int], node: int) -> str:
    return f"{ranks_text(ranks)} {'runs' if len(ranks) == 1 else 'run'} on node {node}"


def _judge(seen: Sequence[Seen], left: Sequence[Left], world_size: int | None) -> Verdict:
    read = [s for s in seen if s.wait is not None and s.wait.kind != "none"]
    unread = sorted(s.rank for s in seen if s not in read)
    waiting = _groups([s for s in read if s.wait is not None and s.wait.in_distributed])
    elsewhere = _groups([s for s in read if s.wait is not None and not s.wait.in_distributed])
    if not seen:
        return Verdict("no rank is running", ())
    if not read:
        return Verdict(f"no stack could be read ({ranks_text(unread)}): see why above; py-spy "
                       "(pip install ddpboot[debug]) reads any rank it may attach to", tuple(unread))
    verdict = _verdict(waiting, elsewhere, left, len(seen), world_size)
    if unread:
        note = f"no stack for {ranks_text(unread)}"
        if verdict.look_at:
            return Verdict(f"{verdict.text} ({note})", verdict.look_at)
        return Verdict(f"{verdict.text}; {note}: look at {ranks_text(unread)}", tuple(unread))
    return verdict


def _verdict(waiting: list[tuple[Wait, list[int]]], elsewhere: list[tuple[Wait, list[int]]], left: Sequence[Left],
             here: int, world_size: int | None) -> Verdict:
    if left and waiting:
        last = min(x.ago for x in left)
        gone = sorted(x.rank for x in left)
        tear = all(w.kind == "destroy" for w, _ in waiting)
        one = len(gone) == 1
        text = (f"{_left_clause(left)}; {_wait_clause(waiting, waited=True)} for {last:.0f} s since then"
                f"{': a teardown hang' if tear else ''}: look at {ranks_text(gone)}, which left while "
                f"{'its' if one else 'their'} peers wait for {'it' if one else 'them'}")
        if elsewhere:
            text += f"; {_elsewhere_clause(elsewhere)}"
        return Verdict(text, tuple(gone))
    if waiting and elsewhere:
        odd = sorted(r for _, ranks in elsewhere for r in ranks)
        return Verdict(f"{_wait_clause(waiting)}; {_elsewhere_clause(elsewhere)}, not in a collective: "
                       f"look at {ranks_text(odd)}", tuple(odd))
    if elsewhere:
        return _outside(elsewhere, left, here, world_size)
    return _among(waiting, here, world_size)


def _outside(elsewhere: list[tuple[Wait, list[int]]], left: Sequence[Left], here: int,
             world_size: int | None) -> Verdict:
    """No rank waits in torch.distributed; the ranks that exited are named, and count as ranks of the job that are
    accounted for (not as ranks on other nodes)."""
    known = here + len(left)
    if world_size is not None and known < world_size:
        exited = f"{_left_clause(left)}; " if left else ""
        return Verdict(f"no rank of this node waits in torch.distributed: {exited}{_elsewhere_clause(elsewhere)} "
                       f"({_others(world_size - known)} on other nodes)", ())
    if left:
        return Verdict(f"{_left_clause(left)}; {_elsewhere_clause(elsewhere)}, none in torch.distributed: not a "
                       "hang between ranks", ())
    if len(elsewhere) == 1:
        return Verdict(f"all ranks are in {place(elsewhere[0][0])}, none in torch.distributed: not a hang between "
                       "ranks (a slow or stuck step of the script)", ())
    return Verdict(f"no rank waits in torch.distributed: {_elsewhere_clause(elsewhere)}", ())


def _others(n: int) -> str:
    return "the other rank runs" if n == 1 else f"the other {n} ranks run"


def _every(n: int) -> str:
    return "the one rank" if n == 1 else f"all {n} ranks"


def _among(waiting: list[tuple[Wait, list[int]]], here: int, world_size: int | None) -> Verdict:
    """Every readable rank waits in torch.distributed."""
    if len(waiting) == 1:
        w = waiting[0][0]
        if world_size is not None and here < world_size:
            return Verdict(f"{_every(here)} of this node {'waits' if here == 1 else 'wait'} in {place(w)}, none "
                           f"elsewhere: {_others(world_size - here)} on other nodes: look there (ddpboot stacks on "
                           "each)", ())
        if w.kind == "p2p":
            return Verdict(f"all {here} ranks wait in {place(w)}: every rank waits for a peer to send or receive "
                           "(a point-to-point deadlock: check the order of sends and receives)", ())
        return Verdict(f"all {here} ranks wait in {place(w)}, none elsewhere: likely a network or peer-node problem",
                       ())
    top = len(waiting[0][1])
    if len(waiting[1][1]) == top:
        return Verdict(f"{_wait_clause(waiting)}: the ranks wait in different calls (one skipped or reordered "
                       "a collective): compare their code paths", ())
    odd = sorted(r for _, ranks in waiting[1:] for r in ranks)
    return Verdict(f"{_wait_clause(waiting)}: look at {ranks_text(odd)}, not where "
                   f"{'its' if len(odd) == 1 else 'their'} peers wait (a skipped or reordered collective)", tuple(odd))
