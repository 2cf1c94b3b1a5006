"""What several ranks say alike, said once: the grouping rule behind the console's `[rank0-3]: ` lines (pure: no
I/O, the time is given).

A member is one source of whole lines (a rank's stdout or its stderr) on one channel (the console stream it goes
to); members are opened before they say anything and closed when their stream ends. A line a member says is held
in a group, keyed by its channel and its exact text:

- it joins the oldest held group of that key that it is not in yet and that is newer than the latest group its
  unit (the rank: both of its streams) already holds a line in; otherwise it starts a new group, whose window ends
  `window` seconds after that first line. So a unit's lines are in groups of rising age, and groups are released
  in the order they were started: the order of a rank's own lines is kept, and so is the order of the first
  sayers' lines across ranks.
- the oldest group is released (said) once its window is over, or once it cannot grow any more: every open member
  of its channel is in it, or can no longer join it (its unit holds a line in a newer group), or has closed. So a
  line every rank says at once is released when the last of them says it, not a window later; a one-rank job is
  never held. Releases are always the oldest groups first.
- `before(member)` releases every group up to the member's unit's latest line: what the launcher must show before
  other output of that rank (a line still open, a progress bar). `flush()` releases everything (a message of the
  launcher's own, the end of the job). Nothing held is ever dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

M = TypeVar("M", bound=Hashable)

WINDOW = 0.2
"""Seconds a line waits for the same line from the other ranks. Ranks that print one warning at one point of the
same code do so within milliseconds of each other, tens of them on a loaded machine; a line every rank says is
released as soon as the last one says it, so only a line that not every rank says waits the whole window, and a
fifth of a second is no lag a reader of a log notices."""


@dataclass(frozen=True)
class Said(Generic[M]):
    """A released group: `text` on `channel`, said by `members` (in the order they said it: the first sayer
    first)."""

    channel: Hashable
    text: bytes
    members: tuple[M, ...]


@dataclass(eq=False)
class _Group(Generic[M]):
    seq: int
    channel: Hashable
    text: bytes
    ends: float
    members: list[M] = field(default_factory=list)
    joined: set[M] = field(default_factory=set)


class Collapser(Generic[M]):
    """The held lines of one console. `unit(member)` names whose order a member's lines keep (default: the member
    itself); every method returns the groups released by what it was told, oldest first."""

    def __init__(self, window: float = WINDOW, unit: Callable[[M], Hashable] | None = None) -> None:
        self.window = window
        self.unit: Callable[[M], Hashable] = unit if unit is not None else (lambda m: m)
        self.channel_of: dict[M, Hashable] = {}  # every member ever opened (a closed one may still be held)
        self.open_on: dict[Hashable, set[M]] = {}  # the open members of each channel
        self.held: deque[_Group[M]] = deque()  # oldest first
        self.by_key: dict[tuple[Hashable, bytes], deque[_Group[M]]] = {}
        self.latest: dict[Hashable, int] = {}  # each unit's newest group (released ones are older than any held)
        self.next_seq = 0

    def open(self, member: M, channel: Hashable) -> None:
        self.channel_of[member] = channel
        self.open_on.setdefault(channel, set()).add(member)

    def close(self, member: M, now: float) -> list[Said[M]]:
        """The member's stream ended: it says nothing more, so groups waiting for it may go."""
        channel = self.channel_of.get(member)
        if channel is not None:
            self.open_on.get(channel, set()).discard(member)
        return self.expired(now)

    def add(self, member: M, text: bytes, now: float) -> list[Said[M]]:
        """`member` said the whole line `text` (its terminator included) at `now`."""
        out = self.expired(now)
        channel = self.channel_of[member]
        unit = self.unit(member)
        floor = self.latest.get(unit, -1)
        key = (channel, text)
        group = next((g for g in self.by_key.get(key, ()) if g.seq > floor and member not in g.joined), None)
        if group is None:
            group = _Group(self.next_seq, channel, text, now + self.window)
            self.next_seq += 1
            self.held.append(group)
            self.by_key.setdefault(key, deque()).append(group)
        group.members.append(member)
        group.joined.add(member)
        self.latest[unit] = group.seq
        return out + self.expired(now)

    def before(self, member: M) -> list[Said[M]]:
        """Release what `member`'s unit holds, and every older group: other output of that rank follows."""
        last = self.latest.get(self.unit(member), -1)
        out = []
        while self.held and self.held[0].seq <= last:
            out.append(self._release())
        return out

    def due(self, now: float) -> float | None:
        """Seconds until the oldest group's window is over; None: nothing is held."""
        return max(0.0, self.held[0].ends - now) if self.held else None

    def expired(self, now: float) -> list[Said[M]]:
        """Release the oldest groups while their window is over or they cannot grow."""
        out = []
        while self.held and (self.held[0].ends <= now or self._full(self.held[0])):
            out.append(self._release())
        return out

    def flush(self) -> list[Said[M]]:
        out = []
        while self.held:
            out.append(self._release())
        return out

    def _full(self, group: _Group[M]) -> bool:
        """No member can join `group` any more: each open member of its channel is in it or past it."""
        return all(m in group.joined or self.latest.get(self.unit(m), -1) > group.seq
                   for m in self.open_on.get(group.channel, ()))

    def _release(self) -> Said[M]:
        group = self.held.popleft()
        key = (group.channel, group.text)
        same = self.by_key[key]
        same.popleft()  # the oldest of its key too
        if not same:
            del self.by_key[key]
        return Said(group.channel, group.text, tuple(group.members))
