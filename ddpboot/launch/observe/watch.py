"""The launcher's watch hook as an observer (spec.py `Watch`): asked every `interval` seconds while no rank is
being stopped (the node link: has another node failed? an elastic round: does a node wait to join?), and told the
attempt's root cause as soon as it is chosen (the node link tells the other nodes)."""

from __future__ import annotations

from collections.abc import Sequence

from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Restart, Running
from ddpboot.launch.spec import Watch


class WatchHook(Observer):
    def __init__(self, watch: Watch, now: float) -> None:
        self.watch = watch
        self.next: float | None = now + watch.interval  # None: never again in this attempt

    @classmethod
    def start(cls, job: Job) -> WatchHook | None:
        return None if job.watch is None else cls(job.watch, job.clock())

    def due(self, now: float) -> float | None:
        return self.next

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        if self.next is None or now < self.next:
            return ()
        if running.stopping:  # the attempt ends anyway: never asked again
            self.next = None
            return ()
        self.next = now + self.watch.interval
        answer = self.watch.check()
        if answer is None:
            return ()
        return (Restart(answer) if isinstance(answer, str) else answer,)

    def on_root(self, worker: Rank) -> None:
        if self.watch.failed is not None:
            self.watch.failed(worker)
