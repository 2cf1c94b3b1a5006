"""What an observer is: the loop calls only the hooks it overrides; a warning is said and kept in status.json; the
attempt's observers are those its options ask for, the status file last."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ddpboot.launch import observe
from ddpboot.launch.observe.base import Answer, Observer, Running, using
from ddpboot.launch.observe.death import DeathCause
from ddpboot.launch.observe.dstate import Uninterruptible
from ddpboot.launch.observe.stacks.dump import StackDumps
from ddpboot.launch.observe.stall import Stall
from ddpboot.launch.observe.startup import Startup
from ddpboot.launch.observe.status import RunStatus, read_status
from ddpboot.launch.observe.straggler import Stragglers
from ddpboot.launch.observe.watch import WatchHook
from ddpboot.launch.spec import Watch
from tests.unit.launch.observe.jobs import Attempt, Clock, job


class Counting(Observer):
    def __init__(self) -> None:
        self.bytes = 0

    def on_output(self, rank: int, data: bytes) -> None:
        self.bytes += len(data)

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        return ()


def test_only_the_hooks_an_observer_overrides_are_called() -> None:
    counting, plain = Counting(), Observer()
    assert using([counting, plain], "on_output") == [counting]
    assert using([counting, plain], "on_wake") == [counting]
    assert using([counting, plain], "due") == []
    assert plain.due(1.0) is None and plain.on_wake(1.0, Attempt()) == ()  # the defaults do nothing


def test_a_warning_is_said_and_kept_in_the_status_file(tmp_path: Path) -> None:
    said: list[str] = []
    clock = Clock()
    j = job(tmp_path, clock, said)
    status = RunStatus.start(j)
    j.warn("ddpboot: gpu watch: pid 7 is not this job's")
    status.update([])
    data = read_status(tmp_path)
    assert said == ["ddpboot: gpu watch: pid 7 is not this job's"]
    assert data is not None and list(data.warnings) == said


def test_an_attempt_is_watched_by_what_its_options_ask_for(tmp_path: Path) -> None:
    clock = Clock()
    plain = observe.start(job(tmp_path, clock, [], straggler_window=0.0))  # no GPU, --stall-timeout, hook, stragglers
    assert [type(o) for o in plain] == [StackDumps, Uninterruptible, DeathCause, Startup, RunStatus]
    every = observe.start(job(tmp_path, clock, [], stall_timeout=60.0, watch=Watch(lambda: None)))
    assert [type(o) for o in every] == [WatchHook, Stall, StackDumps, Uninterruptible, DeathCause, Startup, Stragglers,
                                        RunStatus]
