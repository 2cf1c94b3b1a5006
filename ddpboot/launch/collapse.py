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
from dataclasses import dataclass
from typing import Generic, TypeVar

M = TypeVar("M", bound=Hashable)

WINDOW = 0.2
"""Seconds a line waits for the same line from the other ranks. Ranks that print one warning at one point of the
same code do so within milliseconds of each other, tens of them on a loaded machine; a line every rank says is
released as soon as the last one says it, so only a line that not every rank says waits the whole window, and a
fifth of a second is no lag a reader of a log notices."""


@dataclass(slots=True)
class Said(Generic[M]):
    """A released group: `text` on `channel`, said by `members` (in the order they said it: the first sayer
    first)."""

    channel: Hashable
    text: bytes
    members: tuple[M, ...]


class _Group(Generic[M]):
    __slots__ = ("channel", "ends", "joined", "members", "seq", "text")

    def __init__(self, seq: int, channel: Hashable, text: bytes, ends: float, member: M) -> None:
        self.seq, self.channel, self.text, self.ends = seq, channel, text, ends
        self.members = [member]
        self.joined = {member}


class Collapser(Generic[M]):
    """The held lines of one console. `unit(member)` names whose order a member's lines keep (default: the member
    itself); every method returns the groups released by what it was told, oldest first."""

    def __init__(self, window: float = WINDOW, unit: Callable[[M], Hashable] | None = None) -> None:
        self.window = window
        self.unit: Callable[[M], Hashable] = unit if unit is not None else (lambda m: m)
        self.channel_of: dict[M, Hashable] = {}  # every member ever opened (a closed one may still be held)
        self.unit_of: dict[M, Hashable] = {}
        self.open_of: dict[Hashable, list[M]] = {}  # each unit's open members
        self.held: deque[_Group[M]] = deque()  # oldest first
        self.by_key: dict[tuple[Hashable, bytes], deque[_Group[M]]] = {}
        self.latest: dict[Hashable, int] = {}  # each unit's newest group (released ones are older than any held)
        self.holds: dict[Hashable, int] = {}  # how many held lines each unit has
        # Per channel, its open members whose unit holds nothing: the oldest group cannot grow when there are none
        # (a unit that holds a line holds it in that group or a newer one, and so is in it or past it).
        self.idle: dict[Hashable, int] = {}
        self.next_seq = 0

    def open(self, member: M, channel: Hashable) -> None:
        unit = self.unit(member)
        self.channel_of[member], self.unit_of[member] = channel, unit
        self.open_of.setdefault(unit, []).append(member)
        if not self.holds.get(unit):
            self.idle[channel] = self.idle.get(channel, 0) + 1

    def close(self, member: M, now: float) -> list[Said[M]]:
        """The member's stream ended: it says nothing more, so groups waiting for it may go."""
        unit = self.unit_of.get(member)
        if unit is not None and member in self.open_of[unit]:
            self.open_of[unit].remove(member)
            if not self.holds.get(unit):
                self.idle[self.channel_of[member]] -= 1
        return self.expired(now)

    def add(self, member: M, text: bytes, now: float) -> list[Said[M]]:
        """`member` said the whole line `text` (its terminator included) at `now`."""
        out = self._over(now)
        channel, unit = self.channel_of[member], self.unit_of[member]
        floor = self.latest.get(unit, -1)
        key = (channel, text)
        same = self.by_key.get(key)
        for group in same or ():
            if group.seq > floor and member not in group.joined:
                group.members.append(member)
                group.joined.add(member)
                break
        else:
            group = _Group(self.next_seq, channel, text, now + self.window, member)
            self.next_seq += 1
            self.held.append(group)
            if same is None:
                self.by_key[key] = same = deque()
            same.append(group)
        self.latest[unit] = group.seq
        self._count(unit, 1)
        out += self.expired(now)
        return out

    def before(self, member: M) -> list[Said[M]]:
        """Release what `member`'s unit holds, and every older group: other output of that rank follows."""
        if not self.held:
            return []
        last = self.latest.get(self.unit_of.get(member, member), -1)
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
        while self.held and (self.held[0].ends <= now or not self.idle.get(self.held[0].channel)):
            out.append(self._release())
        return out

    def flush(self) -> list[Said[M]]:
        out = []
        while self.held:
            out.append(self._release())
        return out

    def _over(self, now: float) -> list[Said[M]]:
        out = []
        while self.held and self.held[0].ends <= now:
            out.append(self._release())
        return out

    def _count(self, unit: Hashable, change: int) -> None:
        """A line of `unit` is held (+1) or released (-1); its open members are idle while it holds none."""
        before = self.holds.get(unit, 0)
        self.holds[unit] = before + change
        if (before == 0) != (before + change == 0):
            for m in self.open_of.get(unit, ()):
                channel = self.channel_of[m]
                self.idle[channel] -= change

    def _release(self) -> Said[M]:
        group = self.held.popleft()
        key = (group.channel, group.text)
        same = self.by_key[key]
        same.popleft()  # the oldest of its key too
        if not same:
            del self.by_key[key]
        for m in group.members:
            self._count(self.unit_of[m], -1)
        return Said(group.channel, group.text, tuple(group.members))
