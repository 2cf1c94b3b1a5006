"""Progress bars on the launcher's console: how a rank's `\\r` redraws (tqdm and the like) are shown.

A bar is the text a rank writes after a `\\r` and before the next terminator; logs.py's RankStream finds it and the
Console asks one of the two classes here what to write.

- On a terminal (the console stream is a TTY and TERM is not `dumb`): LiveRegion. Every rank drawing a bar has one
  line of a region at the bottom of the terminal, in the order the bars started; the cursor rests on the line below
  it. A redraw rewrites that rank's own line in place (cursor up, `\\r`, prefix + bar, `\\x1b[K` to erase what a
  longer bar left, cursor back down). Ordinary output is written above the region: the region is erased
  (`\\x1b[J`), the output written, the region drawn again below it. So several ranks' bars never share or scroll a
  line, and a bar finished by a newline leaves the region as one ordinary line.
- In a pipe or a file (or on a dumb terminal): Throttle. Each redraw would otherwise be a line of its own (tqdm
  redraws ten times a second), so a rank's redraws are shown as prefixed lines at most one per `interval` seconds
  (DDPBOOT_PROGRESS_INTERVAL, default 5): the first at once, later ones when they arrive after the interval, or
  when the interval is over for a bar that went quiet (the supervisor's loop wakes for it). The last state is never
  lost: it is shown when the bar ends (newline), when the rank's stream ends, when the bar is
  cleared (tqdm's `leave=False`) and before any other output of the same rank.

Neither uses colour, so NO_COLOR changes nothing here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ddpboot.errors import UsageError

INTERVAL_ENV = "DDPBOOT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 5.0


def progress_interval(environ: Mapping[str, str]) -> float:
    """Seconds between two shown redraws of one rank's bar in a pipe or file (DDPBOOT_PROGRESS_INTERVAL)."""
    text = environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(
            f"{INTERVAL_ENV}={text!r}: give the seconds between two progress-bar lines in a log as a number >= 0 "
            f"(default {DEFAULT_INTERVAL:g}; 0 shows every redraw)."
        )
    return value


def terminal_of(fd: int, environ: Mapping[str, str]) -> int | None:
    """The terminal device `fd` writes to, when bars can be drawn there in place; None for a pipe, a file or a
    dumb terminal."""
    if environ.get("TERM", "") == "dumb":
        return None
    try:
        return os.fstat(fd).st_rdev if os.isatty(fd) else None
    except OSError:
        return None


def blank(text: bytes) -> bool:
    """A bar cleared by spaces (tqdm's `leave=False`, or tqdm.write's clear before its message)."""
    return not text.strip()


@dataclass
class _Shown:
    text: bytes | None = None  # the redraw last shown
    at: float = -math.inf
    latest: bytes = b""  # the redraw last received ("" once cleared)


class Throttle:
    """Pipe and file mode: which of a bar's redraws become lines. Keys are whatever identifies one bar (a stream);
    each method returns the texts to show now, in order."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self.bars: dict[object, _Shown] = {}

    def redraw(self, key: object, text: bytes) -> list[bytes]:
        bar = self.bars.setdefault(key, _Shown())
        if blank(text):
            shown = self.flush(key)
            bar.latest = b""
            return shown
        bar.latest = text
        now = self.clock()
        if text == bar.text or now - bar.at < self.interval:
            return []
        bar.text, bar.at = text, now
        return [text]

    def flush(self, key: object) -> list[bytes]:
        """The last state, if it was not shown yet (other output of the rank follows)."""
        bar = self.bars.get(key)
        if bar is None or not bar.latest or bar.latest == bar.text:
            return []
        bar.text, bar.at = bar.latest, self.clock()
        return [bar.latest]

    def due(self) -> float | None:
        """Seconds until a held-back redraw may be shown (a bar that went quiet); None: none is held back."""
        times = [bar.at + self.interval for bar in self.bars.values() if bar.latest and bar.latest != bar.text]
        return max(0.0, min(times) - self.clock()) if times else None

    def show_due(self) -> list[tuple[object, bytes]]:
        """The held-back redraws whose interval is over, with their keys: a quiet bar's state is at most one
        interval old in the log."""
        now, shown = self.clock(), []
        for key, bar in self.bars.items():
            if bar.latest and bar.latest != bar.text and now - bar.at >= self.interval:
                bar.text, bar.at = bar.latest, now
                shown.append((key, bar.latest))
        return shown

    def end(self, key: object, final: bytes) -> list[bytes]:
        """The bar's line ended (newline) with `final` on it, or its stream ended: the final state, once."""
        bar = self.bars.pop(key, None)
        if bar is not None and final == bar.text:
            return []
        return [final]


class LiveRegion:
    """Terminal mode: the bars' lines at the bottom of the terminal, one per key, the cursor on the line below.
    Each method returns the bytes that bring the screen up to date."""

    def __init__(self, width: Callable[[], int]) -> None:
        self.width = width
        self.lines: dict[object, bytes] = {}
        self.drawn = 0  # how many of the lines are on the screen (0 after erase, until the next draw)

    def __contains__(self, key: object) -> bool:
        return key in self.lines

    def erase(self) -> bytes:
        """Remove the region from the screen; the cursor goes where its first line was."""
        if not self.drawn:
            return b""
        up, self.drawn = self.drawn, 0
        return b"\x1b[%dA\r\x1b[J" % up

    def draw(self) -> bytes:
        """Draw the region below the cursor (which is at the start of a line); empty if it is on the screen."""
        if self.drawn == len(self.lines):
            return b""
        data = self.erase() + b"".join(self._fit(line) + b"\n" for line in self.lines.values())
        self.drawn = len(self.lines)
        return data

    def update(self, key: object, line: bytes) -> bytes:
        """Show `line` as `key`'s bar: its own line rewritten in place, or a new line at the bottom."""
        shown = self.drawn == len(self.lines)
        if key in self.lines:
            if self.lines[key] == line and shown:
                return b""
            self.lines[key] = line
            if not shown:
                return self.draw()
            up = self.drawn - list(self.lines).index(key)
            return b"\x1b[%dA\r%s\x1b[K\x1b[%dB\r" % (up, self._fit(line), up)
        self.lines[key] = line
        if not shown:
            return self.draw()
        self.drawn += 1
        return self._fit(line) + b"\n"

    def remove(self, key: object) -> bytes:
        """Take `key`'s bar out of the region; the cursor ends at the start of the region's first line, erased (the
        caller writes what replaces it, then `draw`)."""
        self.lines.pop(key, None)
        return self.erase()

    def _fit(self, line: bytes) -> bytes:
        """One screen line at most: a wrapped line would put the cursor movements off by a line."""
        limit = max(self.width() - 1, 10)
        text = line.decode(errors="replace")
        return line if len(text) <= limit else text[:limit].encode()
