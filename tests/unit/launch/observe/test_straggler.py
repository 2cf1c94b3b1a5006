"""Stragglers by the ranks' CPU time: which rank one interval points at, persistently over a window and not one
spike, named once and again only when it changes; the observer on a fake clock, and status.json's mark."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ddpboot.launch.observe.base import Rank
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.observe.straggler import SAMPLES, Named, StragglerRule, Stragglers, by_cpu, leaning
from tests.unit.launch.observe.jobs import Attempt, Clock, gpu, job, slot, worker


@pytest.mark.parametrize(("shares", "rank"), [
    ({0: 0.16, 1: 0.96}, 1),  # rank 1 computes six times as long: the other waits
    ({0: 0.96, 1: 0.16}, 0),
    ({0: 0.9, 1: 0.9}, None),  # even
    ({0: 0.5, 1: 0.9}, None),  # not twice the other's
    ({0: 0.05, 1: 0.2}, None),  # four times, but 0.15 of a core: idle ranks' noise
    ({0: 0.0, 1: 0.2}, 1),  # the smallest gap that counts
    ({0: 0.1, 1: 0.1, 2: 0.9, 3: 0.1}, 2),
    ({0: 0.1, 1: 0.9, 2: 0.9, 3: 0.1}, None),  # two slow ranks: the median of the others is slow too
    ({0: 0.9, 1: 0.9, 2: 0.1}, None),
    ({0: 0.9}, None),  # one rank: nobody to be later than
    ({}, None),
])
def test_one_interval_points_at_the_rank_that_computes_while_the_others_wait(shares: dict[int, float],
                                                                            rank: int | None) -> None:
    assert leaning(shares) == rank


def feed(rule: StragglerRule, start: float, steps: int, shares: dict[int, float], cpu: dict[int, float],
         every: float = 1.0) -> list[Named]:
    """`steps` samples `every` seconds apart, each rank using its share; what the rule said."""
    out = []
    for i in range(1, steps + 1):
        for r, s in shares.items():
            cpu[r] = cpu.get(r, 0.0) + s * every
        if (named := rule.observe(start + i * every, dict(cpu))) is not None:
            out.append(named)
    return out


def test_a_rank_slower_over_a_whole_window_is_named_once() -> None:
    rule, cpu = StragglerRule(), {0: 0.0, 1: 0.0}
    assert rule.observe(0.0, dict(cpu)) is None
    assert feed(rule, 0.0, SAMPLES - 1, {0: 0.16, 1: 0.96}, cpu) == []  # not a whole window yet
    said = feed(rule, SAMPLES - 1.0, 1, {0: 0.16, 1: 0.96}, cpu)
    assert [(n.rank, round(n.share, 2), round(n.others, 2), n.window) for n in said] == [(1, 0.96, 0.16, 5.0)]
    assert feed(rule, SAMPLES, 20, {0: 0.16, 1: 0.96}, cpu) == []  # named once
    assert said[0].text(lambda r: "node 0") == (
        "ddpboot: straggler: rank 1 (node 0) is slower than the others: over the last 5.0 s it computed 96% of the "
        "time and the other ranks 16%, waiting for it (the ranks' CPU time)")
    assert said[0].cell() == "96% vs 16%"


def test_one_spike_is_not_a_straggler() -> None:
    rule, cpu = StragglerRule(), {0: 0.0, 1: 0.0}
    rule.observe(0.0, dict(cpu))
    for t in range(0, 30, SAMPLES):  # one slow interval in every window, the rest even
        assert feed(rule, t, 1, {0: 0.1, 1: 1.0}, cpu) == []
        assert feed(rule, t + 1, SAMPLES - 1, {0: 0.9, 1: 0.9}, cpu) == []
    assert feed(rule, 30, SAMPLES - 1, {0: 0.1, 1: 1.0}, cpu) == []  # four in a row: still not the whole window


def test_even_ranks_are_never_named() -> None:
    rule, cpu = StragglerRule(), {0: 0.0, 1: 0.0, 2: 0.0}
    rule.observe(0.0, dict(cpu))
    assert feed(rule, 0.0, 50, {0: 0.9, 1: 0.85, 2: 0.95}, cpu) == []
    assert feed(rule, 50.0, 50, {0: 0.002, 1: 0.002, 2: 0.002}, cpu) == []  # all waiting (the store, a barrier)


def test_the_straggler_is_named_again_only_when_it_changes() -> None:
    rule, cpu = StragglerRule(), {0: 0.0, 1: 0.0, 2: 0.0}
    rule.observe(0.0, dict(cpu))
    assert [n.rank for n in feed(rule, 0.0, 10, {0: 0.1, 1: 0.9, 2: 0.1}, cpu)] == [1]
    # rank 2 takes over: named once its whole window points at it
    said = feed(rule, 10.0, 10, {0: 0.1, 1: 0.1, 2: 0.9}, cpu)
    assert [n.rank for n in said] == [2]
    # even again: one whole window without rank 2 clears it, said once
    said = feed(rule, 20.0, 10, {0: 0.5, 1: 0.5, 2: 0.5}, cpu)
    assert [(n.rank, n.before) for n in said] == [(None, 2)]
    assert said[0].text(str) == ("ddpboot: straggler: rank 2 keeps pace again (no rank was persistently slower "
                                 "over the last 5.0 s)")
    # and the same rank slow again is a change: named again
    assert [n.rank for n in feed(rule, 30.0, 10, {0: 0.1, 1: 0.1, 2: 0.9}, cpu)] == [2]


def test_a_straggler_with_intervals_between_stays_named() -> None:
    rule, cpu = StragglerRule(), {0: 0.0, 1: 0.0}
    rule.observe(0.0, dict(cpu))
    assert len(feed(rule, 0.0, SAMPLES, {0: 0.1, 1: 0.9}, cpu)) == 1
    for t in range(SAMPLES, 40, 2):  # even one interval in two: rank 1 still in every window
        assert feed(rule, t, 1, {0: 0.5, 1: 0.5}, cpu) == []
        assert feed(rule, t + 1, 1, {0: 0.1, 1: 0.9}, cpu) == []


def test_a_rank_that_leaves_or_arrives_is_compared_from_its_second_sample() -> None:
    rule = StragglerRule()
    rule.observe(0.0, {0: 0.0})
    assert rule.observe(1.0, {0: 1.0, 1: 50.0}) is None  # rank 1's first sample: its 50 s count for nothing
    cpu = {0: 1.0, 1: 50.0}
    assert [n.rank for n in feed(rule, 1.0, SAMPLES, {0: 0.1, 1: 0.9}, cpu)] == [1]
    assert rule.observe(7.0, {0: 9.0}) is None  # rank 1 gone: one rank compares with nobody
    assert rule.observe(7.0, {0: 9.5}) is None  # no time passed: no interval


def test_the_window_averages_weigh_each_interval_by_its_length() -> None:
    rule = StragglerRule()
    rule.observe(0.0, {0: 0.0, 1: 0.0})
    t, cpu = 0.0, {0: 0.0, 1: 0.0}
    named = None
    for dt, s0, s1 in [(0.5, 0.2, 1.0), (1.5, 0.0, 0.6), (1.0, 0.1, 0.9), (1.0, 0.1, 0.9), (1.0, 0.1, 0.9)]:
        t, cpu = t + dt, {0: cpu[0] + s0 * dt, 1: cpu[1] + s1 * dt}
        named = rule.observe(t, dict(cpu))
    assert named is not None and named.window == 5.0
    assert named.share == pytest.approx((0.5 + 0.9 + 2.7) / 5.0)
    assert named.others == pytest.approx((0.1 + 0.0 + 0.3) / 5.0)


class Cpu:
    """What the observer reads of the ranks: CPU seconds by global rank."""

    def __init__(self) -> None:
        self.cpu: dict[int, float] = {0: 0.0, 1: 0.0}
        self.reads = 0

    def __call__(self, workers: Sequence[Rank]) -> dict[int, float]:
        self.reads += 1
        return dict(self.cpu)


def test_the_observer_samples_a_fifth_of_the_window_apart_and_says_and_marks_the_straggler(tmp_path: Path) -> None:
    clock, said = Clock(100.0), []
    slots = (slot(0, (gpu(0),)), slot(1, (gpu(1),)))
    j = job(tmp_path, clock, said, slots, straggler_window=5.0)
    watch = Stragglers.start(j)
    assert watch is not None and watch.due(100.0) == 100.0
    cpu = Cpu()
    watch.judge = by_cpu(cpu)
    attempt = Attempt([worker(0, 11, (gpu(0),), tmp_path), worker(1, 12, (gpu(1),), tmp_path)])
    assert isinstance(j.status, RunStatus)
    j.status.begin(0)
    for step in range(SAMPLES + 1):
        clock.now = 100.0 + step
        assert watch.on_wake(clock.now, attempt) == ()
        assert watch.due(clock.now) == clock.now + 1.0
        assert watch.on_wake(clock.now + 0.5, attempt) == ()  # not due: no reading
        cpu.cpu = {0: cpu.cpu[0] + 0.1, 1: cpu.cpu[1] + 0.9}
    assert cpu.reads == SAMPLES + 1
    assert said == ["ddpboot: straggler: rank 1 (GPU 1, node 0) is slower than the others: over the last 5.0 s it "
                    "computed 90% of the time and the other ranks 10%, waiting for it (the ranks' CPU time)"]
    marks = [r.straggler for r in j.status.snapshot(attempt.workers).ranks]
    assert marks == [None, "90% vs 10%"]
    j.status.update(attempt.workers)
    written = json.loads(j.status.path.read_text())
    assert [r["straggler"] for r in written["ranks"]] == [None, "90% vs 10%"]
    j.status.begin(1)  # a new attempt starts over
    assert [r.straggler for r in j.status.snapshot(attempt.workers).ranks] == [None, None]


def test_no_observer_when_off_or_alone_and_none_once_the_attempt_stops(tmp_path: Path) -> None:
    clock = Clock(100.0)
    assert Stragglers.start(job(tmp_path, clock, [], straggler_window=0.0)) is None
    assert Stragglers.start(job(tmp_path, clock, [], (slot(0),), straggler_window=5.0)) is None
    watch = Stragglers.start(job(tmp_path, clock, [], straggler_window=5.0))
    assert watch is not None
    cpu = Cpu()
    watch.judge = by_cpu(cpu)
    assert watch.on_wake(100.0, Attempt(stopping=True)) == ()
    assert watch.due(101.0) is None and cpu.reads == 0
