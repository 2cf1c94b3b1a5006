"""The grouping rule of lines several ranks say alike (collapse.py), on a fake clock: what is held, what joins, when
a group is released, and that nothing held is lost or reordered; hypothesis over random interleavings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpboot.launch.collapse import WINDOW, Collapser, Said

OUT, ERR = "out", "err"


def members(n: int, channel: str = OUT, window: float = 1.0) -> Collapser[tuple[int, str]]:
    """A collapser of n ranks' streams on `channel`: member (rank, channel), ordered by rank."""
    c: Collapser[tuple[int, str]] = Collapser(window, unit=lambda m: m[0])
    for rank in range(n):
        c.open((rank, channel), channel)
    return c


def both_streams(n: int) -> Collapser[tuple[int, str]]:
    """n ranks, each with its stdout and its stderr."""
    c: Collapser[tuple[int, str]] = Collapser(1.0, unit=lambda m: m[0])
    for rank in range(n):
        for ch in (OUT, ERR):
            c.open((rank, ch), ch)
    return c


def said(text: bytes, *ranks: int, channel: str = OUT) -> Said[tuple[int, str]]:
    return Said(channel, text, tuple((r, channel) for r in ranks))


def test_the_window_is_short() -> None:
    assert 0.01 <= WINDOW <= 0.5


def test_a_line_every_rank_says_is_released_once_when_the_last_says_it() -> None:
    c = members(4)
    assert c.add((0, OUT), b"W\n", 0.0) == []
    assert c.add((2, OUT), b"W\n", 0.01) == []
    assert c.add((1, OUT), b"W\n", 0.02) == []
    assert c.due(0.02) == pytest.approx(0.98)
    assert c.add((3, OUT), b"W\n", 0.03) == [said(b"W\n", 0, 2, 1, 3)]
    assert c.due(0.03) is None and c.flush() == []


def test_a_one_rank_job_is_never_held() -> None:
    c = members(1)
    assert c.add((0, OUT), b"a\n", 0.0) == [said(b"a\n", 0)]
    assert c.add((0, OUT), b"a\n", 0.0) == [said(b"a\n", 0)]


def test_a_line_only_some_ranks_say_waits_for_its_window() -> None:
    c = members(4)
    c.add((0, OUT), b"W\n", 0.0)
    c.add((1, OUT), b"W\n", 0.5)
    assert c.expired(0.999) == []
    assert c.due(0.5) == pytest.approx(0.5)
    assert c.expired(1.0) == [said(b"W\n", 0, 1)]
    assert c.due(1.0) is None


def test_a_line_said_after_the_window_starts_a_group_of_its_own() -> None:
    c = members(3)
    c.add((0, OUT), b"W\n", 0.0)
    assert c.add((1, OUT), b"W\n", 1.0) == [said(b"W\n", 0)]  # the old group's window was over first
    assert c.expired(1.5) == []
    assert c.add((2, OUT), b"W\n", 1.5) == []
    assert c.expired(2.0) == [said(b"W\n", 1, 2)]


def test_different_lines_stay_one_per_rank_in_the_order_they_came() -> None:
    c = members(3)
    c.add((0, OUT), b"rank 0 here\n", 0.0)
    c.add((1, OUT), b"rank 1 here\n", 0.1)
    assert c.expired(0.999) == []
    assert c.expired(1.0) == [said(b"rank 0 here\n", 0)]
    assert c.expired(1.1) == [said(b"rank 1 here\n", 1)]


def test_a_group_is_released_once_no_open_rank_can_join_it() -> None:
    c = members(3)
    c.add((0, OUT), b"only mine\n", 0.0)
    assert c.add((1, OUT), b"mine too\n", 0.1) == []  # rank 2 could still say "only mine"
    # rank 2 says something newer: no rank can join "only mine" any more (rank 1's next line is newer too)
    assert c.add((2, OUT), b"and more\n", 0.2) == [said(b"only mine\n", 0)]
    assert c.add((0, OUT), b"next\n", 0.3) == [said(b"mine too\n", 1)]
    assert c.expired(0.3) == []  # rank 1 could still say "and more"
    assert c.add((1, OUT), b"and more\n", 0.4) == [said(b"and more\n", 2, 1)]
    assert c.flush() == [said(b"next\n", 0)]


def test_a_rank_says_the_same_line_twice_each_joins_its_own_group() -> None:
    c = members(2)
    c.add((0, OUT), b"step\n", 0.0)
    c.add((0, OUT), b"step\n", 0.1)
    assert c.add((1, OUT), b"step\n", 0.2) == [said(b"step\n", 0, 1)]
    assert c.add((1, OUT), b"step\n", 0.3) == [said(b"step\n", 0, 1)]


def test_a_rank_never_joins_a_group_older_than_its_own_last_line() -> None:
    c = members(3)  # rank 2 says nothing: every group waits
    c.add((0, OUT), b"A\n", 0.0)
    c.add((1, OUT), b"B\n", 0.1)
    c.add((1, OUT), b"A\n", 0.2)  # joining the first A would show it before rank 1's own B
    c.add((0, OUT), b"B\n", 0.3)  # rank 0's last line is the first A: it may join B
    assert c.flush() == [said(b"A\n", 0), said(b"B\n", 1, 0), said(b"A\n", 1)]


def test_the_same_rank_order_over_both_of_its_streams() -> None:
    c = both_streams(2)
    out = c.add((0, ERR), b"warn\n", 0.0) + c.add((1, OUT), b"hello\n", 0.1)
    out += c.add((1, ERR), b"warn\n", 0.2)  # rank 1's stdout line is newer than the warning's group
    assert out + c.flush() == [said(b"warn\n", 0, channel=ERR), said(b"hello\n", 1), said(b"warn\n", 1, channel=ERR)]


def test_the_same_text_on_two_channels_is_two_lines() -> None:
    c = both_streams(2)
    out = c.add((0, OUT), b"x\n", 0.0) + c.add((1, ERR), b"x\n", 0.0)
    assert out + c.flush() == [said(b"x\n", 0), said(b"x\n", 1, channel=ERR)]


def test_before_releases_what_the_rank_holds_and_everything_older() -> None:
    c = members(4)  # rank 3 says nothing: every group waits
    c.add((1, OUT), b"first\n", 0.0)
    c.add((0, OUT), b"mine\n", 0.1)
    c.add((2, OUT), b"later\n", 0.2)
    assert c.before((0, OUT)) == [said(b"first\n", 1), said(b"mine\n", 0)]
    assert c.before((0, OUT)) == []
    assert c.before((2, OUT)) == [said(b"later\n", 2)]
    assert c.before((1, OUT)) == []


def test_a_closed_stream_is_not_waited_for() -> None:
    c = members(3)
    c.add((0, OUT), b"bye\n", 0.0)
    c.add((1, OUT), b"bye\n", 0.0)
    assert c.close((2, OUT), 0.1) == [said(b"bye\n", 0, 1)]


def test_what_a_closed_stream_held_is_still_released() -> None:
    c = members(2)
    c.add((0, OUT), b"last words\n", 0.0)
    assert c.close((0, OUT), 0.1) == []  # rank 1 may still say them
    assert c.close((1, OUT), 0.2) == [said(b"last words\n", 0)]


def test_every_stream_closed_releases_everything() -> None:
    c = members(3)
    c.add((0, OUT), b"a\n", 0.0)
    c.add((1, OUT), b"b\n", 0.0)
    assert c.close((0, OUT), 0.0) == [] and c.close((1, OUT), 0.0) == []
    assert c.close((2, OUT), 0.0) == [said(b"a\n", 0), said(b"b\n", 1)]


def test_closing_an_unknown_member_changes_nothing() -> None:
    c = members(2)
    c.add((0, OUT), b"a\n", 0.0)
    assert c.close((9, OUT), 0.0) == []
    assert c.due(0.0) == pytest.approx(1.0)


def test_the_flush_releases_everything_in_order() -> None:
    c = members(4)  # rank 3 says nothing: every group waits
    c.add((0, OUT), b"a\n", 0.0)
    c.add((1, OUT), b"a\n", 0.0)
    c.add((2, OUT), b"b\n", 0.0)
    assert c.flush() == [said(b"a\n", 0, 1), said(b"b\n", 2)]
    assert c.flush() == [] and c.due(5.0) is None


def test_due_is_never_negative() -> None:
    c = members(2)
    c.add((0, OUT), b"a\n", 0.0)
    assert c.due(7.0) == 0.0


def test_the_default_unit_is_the_member() -> None:
    c: Collapser[str] = Collapser(1.0)
    c.open("a", OUT)
    c.open("b", OUT)
    c.add("a", b"x\n", 0.0)
    assert c.add("b", b"x\n", 0.0) == [Said(OUT, b"x\n", ("a", "b"))]


# --- every interleaving: nothing lost, nothing duplicated, each rank's order kept, and the window respected ------

events = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([b"w\n", b"x\n", b"y\n"]),
                            st.floats(0.0, 0.3), st.sampled_from(["add", "add", "add", "tick", "before"])),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(events)
def test_any_interleaving_keeps_every_line_and_each_ranks_order(script: list[tuple[int, bytes, float, str]]) -> None:
    c = members(4, window=0.2)
    now = 0.0
    sent: dict[int, list[bytes]] = {r: [] for r in range(4)}
    shown: dict[int, list[bytes]] = {r: [] for r in range(4)}

    def take(released: list[Said[tuple[int, str]]]) -> None:
        for group in released:
            assert len(set(group.members)) == len(group.members)  # a rank at most once in a group
            for m in group.members:
                shown[m[0]].append(group.text)

    for rank, text, step, what in script:
        now += step
        if what == "add":
            sent[rank].append(text)
            take(c.add((rank, OUT), text, now))
        elif what == "tick":
            take(c.expired(now))
            assert c.due(now) is None or c.due(now) > 0  # nothing whose window is over stays held
        else:
            take(c.before((rank, OUT)))
            assert c.before((rank, OUT)) == []  # the rank holds nothing now
        assert all(len(group.members) < 4 for group in c.held)  # a group every rank is in is never held
        if c.held and what != "before":  # the oldest group stays held only while some rank may still join it
            oldest = c.held[0]
            assert any((r, OUT) not in oldest.joined and c.latest.get(r, -1) < oldest.seq for r in range(4))
    for rank in range(4):
        take(c.close((rank, OUT), now))
    assert c.due(now) is None and c.flush() == []
    assert shown == sent  # every line once, in each rank's own order
