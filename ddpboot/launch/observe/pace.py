"""What both straggler judges share (straggler.py: the ranks' CPU time; waits.py: NCCL's collectives): the window of
SAMPLES samples, each pointing at one rank or none, and the rule over it: a rank is named once every sample of a
whole window points at it, and again only when that changes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

SAMPLES = 5  # samples in a window: a straggler is pointed at by every one of them
RATIO = 2.0  # the straggler took at least this many times as long as every other rank (its CPU; their waits)


def persistent(points: Sequence[int | None], named: int | None) -> tuple[int | None, int | None]:
    """The rule over a window (`points`: the rank each of its last SAMPLES samples pointed at, oldest first) with
    `named` the straggler named so far: (what changed, the straggler now). What changed: None, nothing; the new
    straggler when every sample points at one rank that is not `named`; `named` when none points at it any more
    (cleared: the straggler now None)."""
    if len(points) < SAMPLES:
        return None, named
    if points[0] is not None and all(p == points[0] for p in points) and points[0] != named:
        return points[0], points[0]
    if named is not None and named not in points:
        return named, None
    return None, named


class Change(Protocol):
    """What a rule says when the straggler changed."""

    @property
    def rank(self) -> int | None:
        """The straggler now; None: none any more."""
        ...

    def text(self, where: Callable[[int], str]) -> str: ...

    def cell(self) -> str: ...


