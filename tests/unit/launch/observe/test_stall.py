"""--stall-timeout while the job runs: what counts as progress (output, an exit, a busy or runnable rank), a quiet job
whose ranks spin judged by their stacks, nothing once the attempt stops; on a fake clock with readings given, and
the CPU readings of real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path

from ddpboot.launch.observe.base import Rank, Stalled
from ddpboot.launch.observe.stall import Stall, cpu_samples
from tests.unit.launch.observe.jobs import Attempt, Clock, job, worker

IDLE = "no output, no rank exited, no rank busy on a CPU"
SAME = "no output, no rank exited, the same stacks in every rank"


class Ranks:
    """What the observer reads of the ranks: CPU seconds by worker index, whether one is runnable, their stacks."""

    def __init__(self) -> None:
        self.clock = Clock(0.0)
        self.cpu: dict[int, float] = {}
        self.running = False
        self.stacks: Hashable | None = None
        self.samples = 0
        self.snapshots: list[float] = []

    def sample(self, workers: Sequence[Rank]) -> dict[int, tuple[float, bool]]:
        self.samples += 1
        return {i: (c, self.running) for i, c in self.cpu.items()}

    def fingerprint(self, workers: Sequence[Rank]) -> Hashable | None:
        self.snapshots.append(self.clock.now)
        return self.stacks


def watching(timeout: float) -> tuple[Stall, Ranks]:
    ranks = Ranks()
    return Stall(timeout, 0.0, ranks.clock, ranks.sample, ranks.fingerprint), ranks


def wake(stall: Stall, ranks: Ranks, now: float, attempt: Attempt | None = None) -> list[object]:
    ranks.clock.now = now
    return list(stall.on_wake(now, attempt or Attempt()))


def quiet(stall: Stall, ranks: Ranks, start: int, end: int) -> None:
    for t in range(start, end):
        assert wake(stall, ranks, float(t)) == [], t


def test_a_job_without_progress_for_the_timeout_is_stalled_once() -> None:
    stall, ranks = watching(10.0)
    assert stall.due(0.0) == 1.0  # a sample a second (a fifth of the timeout when that is shorter)
    ranks.cpu = {0: 1.0, 1: 1.0}
    stall.on_output(0, b"x" * 100)
    assert wake(stall, ranks, 1.0) == []  # the first sample: the output since the start counts
    for t in range(2, 11):
        ranks.cpu = {0: 1.0 + t * 0.001, 1: 1.0}  # a sliver of CPU, no output
        assert wake(stall, ranks, float(t)) == []
    assert wake(stall, ranks, 11.0) == [Stalled(10.0, IDLE)]
    assert wake(stall, ranks, 12.0) == [] and stall.due(12.0) is None


def test_busy_cpu_output_and_exits_are_progress() -> None:
    stall, ranks = watching(10.0)
    ranks.cpu = {0: 1.0, 1: 1.0}
    quiet(stall, ranks, 1, 8)
    ranks.cpu = {0: 4.0, 1: 1.0}  # rank 0 computed: a quiet step, not a stall
    quiet(stall, ranks, 8, 18)
    stall.on_output(1, b"step 3\n")
    quiet(stall, ranks, 18, 28)
    stall.on_exit(worker(1, 11))
    quiet(stall, ranks, 28, 38)
    assert wake(stall, ranks, 38.0) == [Stalled(10.0, IDLE)]


def test_a_rank_waiting_for_a_core_is_busy_on_a_crowded_machine() -> None:
    stall, ranks = watching(10.0)
    ranks.running = True  # runnable, but it barely gets a core
    for t in range(1, 30):
        ranks.cpu = {0: 1.0 + t * 0.01, 1: 1.0}
        assert wake(stall, ranks, float(t)) == []
    ranks.running = False
    answers = [(t, a) for t in range(30, 41) for a in wake(stall, ranks, float(t))]
    assert answers == [(39, Stalled(10.0, IDLE))]  # ten seconds after the last runnable sample


def test_a_quiet_job_whose_ranks_spin_is_stalled_when_their_stacks_stay_the_same() -> None:
    stall, ranks = watching(8.0)
    ranks.stacks = ("same", "stacks")
    for step in range(1, 40):
        now = step * 0.5
        ranks.cpu = {0: now, 1: now}  # a core spinning in every rank: CPU time never says stalled
        answers = wake(stall, ranks, now)
        if answers:
            break
    assert ranks.snapshots[0] == 4.0  # quiet for half the timeout
    assert answers == [Stalled(8.0, SAME)] and now == 8.0


def test_moving_or_unreadable_stacks_are_no_stall() -> None:
    for fingerprints in (lambda n: ("line", n), lambda n: None):
        stall, ranks = watching(8.0)
        for step in range(1, 60):
            now = step * 0.5
            ranks.cpu = {0: now, 1: now}
            ranks.stacks = fingerprints(step)
            assert wake(stall, ranks, now) == []
        assert ranks.snapshots


def test_nothing_is_read_or_answered_once_the_attempt_stops() -> None:
    stall, ranks = watching(10.0)
    assert wake(stall, ranks, 20.0, Attempt(stopping=True)) == [] and ranks.samples == 0
    assert stall.due(20.0) is None and wake(stall, ranks, 40.0) == []


def test_the_option_starts_it(tmp_path: Path) -> None:
    clock = Clock(5.0)
    assert Stall.start(job(tmp_path, clock, [])) is None
    stall = Stall.start(job(tmp_path, clock, [], stall_timeout=30.0))
    assert stall is not None and stall.due(5.0) == 6.0 and stall.watch.timeout == 30.0


def test_cpu_is_read_for_the_running_ranks_only() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        gone = worker(2, child.pid)
        gone.status = 0  # reaped: its pid is not its own any more
        got = cpu_samples([worker(0, os.getpid()), worker(1, child.pid), gone, worker(3, 0)])
    finally:
        child.communicate(b"")
    assert set(got) == {0, 1}
    assert got[0][0] > 0 and got[0][1]  # this process: running, with CPU time
