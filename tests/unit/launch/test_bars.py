"""Progress bars' pure parts: the interval, the throttle of a log, the live region of a terminal."""

from __future__ import annotations

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.bars import LiveRegion, Throttle, progress_interval
from tests.support import render_terminal


def test_the_interval_comes_from_the_environment() -> None:
    assert progress_interval({}) == 5.0
    assert progress_interval({"DDPBOOT_PROGRESS_INTERVAL": " 0.5 "}) == 0.5
    for bad in ("-1", "nan", "inf", "5s"):
        with pytest.raises(UsageError, match=r"DDPBOOT_PROGRESS_INTERVAL=.*a number >= 0"):
            progress_interval({"DDPBOOT_PROGRESS_INTERVAL": bad})


def test_the_throttle_shows_the_first_redraw_then_one_per_interval_and_the_final_state_once() -> None:
    now = [0.0]
    t = Throttle(2.0, lambda: now[0])
    shown = []
    for i in range(10):  # a redraw every 0.5 s
        shown += t.redraw("bar", b"%d" % i)
        now[0] += 0.5
    assert shown == [b"0", b"4", b"8"]
    assert t.end("bar", b"9") == [b"9"]
    assert t.redraw("bar", b"0") == [b"0"]  # a new bar: its first redraw at once
    assert t.end("bar", b"0") == []  # already shown


def test_region_lines_are_cut_to_the_terminal_width_so_the_cursor_arithmetic_holds() -> None:
    region = LiveRegion(lambda: 20)
    screen = region.update("a", b"[rank0]: " + b"#" * 40) + region.update("b", b"[rank1]: short")
    screen += region.update("a", b"[rank0]: x")
    assert render_terminal(screen) == ["[rank0]: x", "[rank1]: short"]
    assert region.update("a", "[rank0]: é".encode() * 3) == "\x1b[2A\r[rank0]: é[rank0]: \x1b[K\x1b[2B\r".encode()
