"""SLURM host lists (`node[01-04,07],gpu-a[1-2]-ib`) expanded to host names, in `scontrol show hostnames` order.

Written from SLURM's documented behaviour and checked against `scontrol show hostnames` (slurm-wlm 22.05); it is
our own code because python-hostlist is GPL. The syntax:

- Items are separated by commas or whitespace; a comma inside brackets separates ranges, not hosts.
- An item is literal text with bracket groups in it: `prefix[ranges]`, `gpu-a[1-2]-ib`, `rack[1-2]-n[01-02]`.
  A group holds comma-separated numbers and `lo-hi` ranges, kept in the order written (duplicates stay).
- Zero padding comes from each range's low bound, as in SLURM: `[08-10]` gives 08 09 10, `[8-10]` gives 8 9 10,
  `[1-010]` gives 1 .. 10.
- With several groups the last varies fastest. For two groups that is plain lexicographic order (rack1-n01,
  rack1-n02, rack2-n01, ...). For three or more we follow SLURM, which expands the groups before the last from right
  to left: `a[1-2]b[3-4]c[5-6]` gives a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ... (measured with scontrol).

Deliberately stricter than SLURM, which silently repairs or skips what it cannot read: an unbalanced bracket, a
range that is not `lo-hi` with lo <= hi, whitespace inside brackets, an empty item (`a,,b`) or an empty list raises
UsageError, with the expression and a caret under the problem. Accepted beyond SLURM 22.05: text after the last
group (`gpu-a[1-2]-ib`), which scontrol 22.05 rejects but pdsh, python-hostlist and Flux accept.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from ddpboot.errors import UsageError

MAX_HOSTS = 100_000
"""A list expanding to more hosts than this is taken as a mistake (`n[0-99999999]`), not expanded."""

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


@dataclass(frozen=True)
class _Range:
    lo: int
    hi: int
    width: int  # zero-padding width, from the low bound as written

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1

    def first(self) -> str:
        return str(self.lo).zfill(self.width)

    def values(self) -> list[str]:
        return [str(n).zfill(self.width) for n in range(self.lo, self.hi + 1)]


@dataclass(frozen=True)
class _Item:
    """One host expression: literals[0] group[0] literals[1] group[1] ... literals[-1]."""

    literals: tuple[str, ...]
    groups: tuple[tuple[_Range, ...], ...]

    @property
    def count(self) -> int:
        return math.prod(sum(r.size for r in group) for group in self.groups)

    def first(self) -> str:
        parts = [self.literals[0]]
        for group, literal in zip(self.groups, self.literals[1:], strict=True):
            parts += [group[0].first(), literal]
        return "".join(parts)

    def hosts(self) -> list[str]:
        k = len(self.groups)
        if k == 0:
            return [self.literals[0]]
        # SLURM's nesting, outermost first: groups k-2, k-3, ..., 0, then k-1 (plain lexicographic for k <= 2).
        order = [*range(k - 2, -1, -1), k - 1]
        values = [[v for r in self.groups[g] for v in r.values()] for g in order]
        out: list[str] = []
        for combo in itertools.product(*values):
            chosen = [""] * k
            for g, value in zip(order, combo, strict=True):
                chosen[g] = value
            out.append(self.literals[0] + "".join(c + lit for c, lit in zip(chosen, self.literals[1:], strict=True)))
        return out


def expand_hostlist(expr: str) -> list[str]:
    """Every host named by SLURM host list `expr`, in SLURM's order, duplicates kept.

    Raises UsageError (expression, position, caret) for a malformed list or one of more than MAX_HOSTS hosts.
    """
    return [host for item in _parse(expr) for host in item.hosts()]


def first_host(expr: str) -> str:
    """The first host of `expr` (where SLURM jobs put the rendezvous store), without expanding the whole list.

    The whole expression is still checked, so a malformed list fails here as it would in expand_hostlist.
    """
    return _parse(expr)[0].first()


def _parse(expr: str) -> list[_Item]:
    items = [_parse_item(expr, start, end) for start, end in _split_items(expr)]
    total = sum(item.count for item in items)
    if total > MAX_HOSTS:
        raise _error(expr, 0, f"expands to {total} hosts, more than the {MAX_HOSTS} ddpboot accepts")
    return items


def _split_items(expr: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the items of `expr`, with the bracket and separator checks done on the way."""
    return _ItemSplitter(expr).split()


class _ItemSplitter:
    """One left-to-right pass over a host list: where each item starts and ends, and whether the brackets and
    separators between them are well formed. Each character is handled by the state it is read in: inside a
    bracket group, as a separator, or as part of an item."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.spans: list[tuple[int, int]] = []
        self.start: int | None = None  # start of the item being read
        self.open_at: int | None = None  # position of the '[' we are inside
        self.item_since_comma = False
        self.last_comma = -1

    def split(self) -> list[tuple[int, int]]:
        for i, ch in enumerate(self.expr):
            if self.open_at is not None:
                self._in_brackets(i, ch)
            elif ch == "," or ch.isspace():
                self._separator(i, ch)
            else:
                self._in_item(i, ch)
        return self._finish()

    def _in_brackets(self, i: int, ch: str) -> None:
        if ch == "[":
            raise _error(self.expr, i, "'[' inside brackets (groups cannot nest)")
        if ch == "]":
            self.open_at = None
        elif ch.isspace():
            raise _error(self.expr, i, "whitespace inside brackets")

    def _separator(self, i: int, ch: str) -> None:
        if self.start is not None:
            self.spans.append((self.start, i))
            self.start = None
        if ch == ",":
            if not self.item_since_comma:
                raise _error(self.expr, i, "empty item before ','")
            self.item_since_comma = False
            self.last_comma = i

    def _in_item(self, i: int, ch: str) -> None:
        if ch == "]":
            raise _error(self.expr, i, "']' without a matching '['")
        if self.start is None:
            self.start = i
            self.item_since_comma = True
        if ch == "[":
            self.open_at = i

    def _finish(self) -> list[tuple[int, int]]:
        if self.open_at is not None:
            raise _error(self.expr, self.open_at, "'[' is never closed")
        if self.start is not None:
            self.spans.append((self.start, len(self.expr)))
        if not self.spans:
            raise _error(self.expr, 0, "empty host list")
        if not self.item_since_comma:
            raise _error(self.expr, self.last_comma, "empty item after ','")
        return self.spans


def _parse_item(expr: str, start: int, end: int) -> _Item:
    """One item whose brackets are known to be balanced and unnested (checked by _split_items)."""
    literals: list[str] = []
    groups: list[tuple[_Range, ...]] = []
    pos = start
    while (open_at := expr.find("[", pos, end)) != -1:
        close_at = expr.index("]", open_at, end)
        literals.append(expr[pos:open_at])
        groups.append(_parse_group(expr, open_at + 1, close_at))
        pos = close_at + 1
    literals.append(expr[pos:end])
    return _Item(tuple(literals), tuple(groups))


def _parse_group(expr: str, start: int, end: int) -> tuple[_Range, ...]:
    """The ranges between '[' and ']' at expr[start:end], e.g. `01-04,07`."""
    ranges: list[_Range] = []
    pos = start
    while True:
        comma = expr.find(",", pos, end)
        stop = end if comma == -1 else comma
        text = expr[pos:stop]
        match = _RANGE.fullmatch(text)
        if not text:
            raise _error(expr, pos, "empty range in brackets")
        if match is None or not text.isascii():
            raise _error(expr, pos, f"{text!r} is not a number or a range lo-hi")
        lo_text, hi_text = match.groups()
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise _error(expr, pos, f"range {text!r} goes down (write the low bound first)")
        ranges.append(_Range(lo, hi, len(lo_text)))
        if comma == -1:
            return tuple(ranges)
        pos = comma + 1


def _error(expr: str, pos: int, problem: str) -> UsageError:
    shown = "".join(" " if ch.isspace() else ch for ch in expr)  # keep the caret under the right character
    return UsageError(
        f"malformed host list: {problem} (character {pos + 1}):\n"
        f"  {shown}\n"
        f"  {' ' * pos}^\n"
        "Expected SLURM's syntax, e.g. 'node[01-04,07],gpu-a[1-2]-ib' (see `scontrol show hostnames`)."
    )
