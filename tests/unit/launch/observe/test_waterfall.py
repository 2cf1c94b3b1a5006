"""waterfall.py: a rank's marks as phases, and the slow rank named only when it lost noticeably more."""

from __future__ import annotations

import pytest

from ddpboot.launch.observe.waterfall import LOSS_MIN, LOSS_RATIO, PHASES, Slowest, phases, slowest, startup_line


def test_every_mark_makes_its_phase_in_order() -> None:
    marks = {"up": 100.5, "torch": 104.0, "cuda_start": 104.5, "cuda": 106.0, "pg_start": 107.0, "pg": 109.0}
    got = phases(100.0, marks, first_output=110.0, nccl=0.75)
    assert got == {"python": 0.5, "imports": 3.5, "cuda": 1.5, "nccl": 0.75, "setup": 1.5, "rendezvous": 2.0,
                   "first_output": 1.0}
    assert list(got) == [p for p in PHASES if p in got]


def test_a_rank_s_phases_go_as_far_as_its_marks() -> None:
    assert phases(100.0, {}) == {}
    assert phases(100.0, {"up": 101.0}) == {"python": 1.0}
    assert phases(100.0, {"up": 101.0, "torch": 102.0}, first_output=103.0) == {"python": 1.0, "imports": 1.0}
    # a CUDA context made after the group is up is not the script's setup
    late = phases(100.0, {"up": 101.0, "torch": 102.0, "pg_start": 103.0, "pg": 104.0, "cuda_start": 105.0,
                          "cuda": 107.0})
    assert late["setup"] == 1.0 and late["cuda"] == 2.0
    # a forked rank: torch was imported by its parent, so there from its start
    assert phases(100.0, {"up": 100.1, "torch": 100.1, "pg_start": 104.2, "pg": 104.3}) == {
        "python": 0.1, "imports": 0.0, "setup": 4.1, "rendezvous": 0.1}


def test_the_slow_rank_is_named_with_its_phase() -> None:
    table = {0: {"imports": 3.0, "setup": 1.0, "rendezvous": 7.0}, 1: {"imports": 7.2, "setup": 1.1},
             2: {"imports": 3.1, "setup": 0.9}}
    slow = slowest(table)
    assert slow == Slowest(1, "imports", 7.2, 3.1)
    assert startup_line(slow, 9.5) == ("ddpboot: start-up 9.5 s: slowest rank 1: imports 7.2 s (the others at most "
                                       "3.1 s)")
    assert startup_line(slow, 41.2, node=2).startswith("ddpboot: start-up 41.2 s: slowest rank 1 (node 2): imports")


@pytest.mark.parametrize(("slow", "fast", "named"), [
    (3.0 + LOSS_MIN, 3.0, True),  # the loss and the ratio both met
    (3.0 + LOSS_MIN - 0.01, 3.0, False),  # less than LOSS_MIN more
    (20.0, 20.0 / LOSS_RATIO + 0.01, False),  # more than LOSS_MIN, but not LOSS_RATIO times as long
    (20.0, 20.0 / LOSS_RATIO, True),
])
def test_the_threshold(slow: float, fast: float, named: bool) -> None:
    assert (slowest({0: {"setup": fast}, 1: {"setup": slow}}) is not None) is named


def test_no_line_for_one_rank_waiting_alone_or_phases_nobody_else_has() -> None:
    assert slowest({0: {"imports": 30.0}}) is None
    assert slowest({0: {"imports": 30.0}, 1: {"python": 0.1}}) is None
    # waiting in the rendezvous for a slow rank is no loss of its own
    assert slowest({0: {"imports": 3.0, "rendezvous": 30.0}, 1: {"imports": 3.1, "rendezvous": 0.1}}) is None


def test_the_largest_loss_wins() -> None:
    table = {0: {"imports": 10.0, "cuda": 1.0}, 1: {"imports": 3.0, "cuda": 9.0}, 2: {"imports": 3.0, "cuda": 1.0}}
    assert slowest(table) == Slowest(1, "cuda", 9.0, 1.0)


def test_the_phase_a_rank_is_in_now() -> None:
    from ddpboot.launch.observe.waterfall import current_phase

    assert current_phase({}) == "python"
    assert current_phase({"up": 1.0}) == "imports"
    assert current_phase({"up": 1.0, "torch": 2.0}) == "setup"
    assert current_phase({"up": 1.0, "torch": 2.0, "cuda_start": 2.5}) == "cuda"
    assert current_phase({"up": 1.0, "torch": 2.0, "cuda_start": 2.5, "cuda": 3.0}) == "setup"
    assert current_phase({"up": 1.0, "torch": 2.0, "pg_start": 3.0}) == "rendezvous"
    assert current_phase({"up": 1.0, "torch": 2.0, "pg_start": 3.0, "pg": 4.0}) is None
