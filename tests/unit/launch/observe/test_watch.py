"""The launcher's watch hook as an observer: asked every interval, never once the attempt stops, its answers as the
decisions take them, and the root cause handed on."""

from __future__ import annotations

from pathlib import Path

from ddpboot.launch.observe.base import Restart
from ddpboot.launch.observe.watch import WatchHook
from ddpboot.launch.spec import EndJob, Watch
from tests.unit.launch.observe.jobs import Attempt, Clock, job, worker


def test_asked_every_interval_and_never_once_the_attempt_stops(tmp_path: Path) -> None:
    answers: list[str | EndJob | None] = [None, "a node waits to join", EndJob(3, "node 1 failed")]
    asked: list[float] = []
    clock = Clock(10.0)

    def check() -> str | EndJob | None:
        asked.append(clock.now)
        return answers.pop(0)

    assert WatchHook.start(job(tmp_path, clock, [])) is None
    hook = WatchHook.start(job(tmp_path, clock, [], watch=Watch(check, 1.0)))
    assert hook is not None and hook.due(10.0) == 11.0
    running = Attempt()
    assert hook.on_wake(10.5, running) == () and not asked
    for now, answer in ((11.0, ()), (12.0, (Restart("a node waits to join"),)), (13.0, (EndJob(3, "node 1 failed"),))):
        clock.now = now
        assert hook.on_wake(now, running) == answer
        assert hook.due(now) == now + 1.0
    assert hook.on_wake(14.0, Attempt(stopping=True)) == () and hook.due(14.0) is None
    assert hook.on_wake(20.0, running) == () and asked == [11.0, 12.0, 13.0]


def test_the_root_cause_is_handed_to_the_hook(tmp_path: Path) -> None:
    told = []
    hook = WatchHook.start(job(tmp_path, Clock(), [], watch=Watch(lambda: None, 1.0, told.append)))
    assert hook is not None
    root = worker(1, 4242)
    hook.on_root(root)
    assert told == [root]
    quiet = WatchHook.start(job(tmp_path, Clock(), [], watch=Watch(lambda: None, 1.0)))
    assert quiet is not None
    quiet.on_root(root)  # no `failed`: nothing to tell
