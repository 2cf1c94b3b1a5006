"""The node link (nodes/watch.py) wired into a run: started before the supervisor, started watching after the
nodes' check-in, asked at every watch tick whether another node failed, told this node's root cause, and asked
for the job's verdict at the end (the supervisor's `after_job`)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator

from ddpboot.contract import STOP_SIGNALS
from ddpboot.launch.config import LaunchConfig
from ddpboot.launch.spec import EndJob, Watch
from ddpboot.nodes.outcome import stop_text, summary
from ddpboot.nodes.watch import NodeLink, mpi_parent, wants_link

WATCH_INTERVAL = 0.1  # seconds between two looks at the link's pipe while the ranks run
NOTICE_AFTER = 5.0  # seconds node 0 waits for the other nodes' ends before it says so


@contextlib.contextmanager
def node_link(config: LaunchConfig) -> Iterator[NodeLink | None]:
    """The node link of this launcher, when it needs one (several nodes, or an MPI parent), closed at the end."""
    parent = mpi_parent(dict(config.env))
    if not wants_link(config.nodes, parent):
        yield None
        return
    link = NodeLink.start(config.nodes, config.link_timing, parent, dict(config.env))
    try:
        yield link
    finally:
        link.close()


def link_watch(link: NodeLink, ranks: int) -> Watch:
    """The supervisor's watch: another node's failure (or this node's lost MPI parent) ends the attempt with the
    root cause's code; this node's root cause goes to the link as soon as it is chosen."""

    def check() -> EndJob | None:
        stop, _ = link.poll()
        return None if stop is None else EndJob(stop.code, stop_text(stop, ranks))

    def failed(worker: object) -> None:
        from ddpboot.launch.supervisor.workers import Worker, describe_status

        assert isinstance(worker, Worker) and worker.status is not None
        tail = worker.err.last_lines(1) or worker.out.last_lines(1)
        link.failed(worker.slot.rank, worker.code, describe_status(worker.status), tail[-1] if tail else "")

    return Watch(check, WATCH_INTERVAL, failed)


def link_verdict(link: NodeLink) -> Callable[[int, object, Callable[[str], None]], int]:
    """The supervisor's after_job: this node's end to the link, and the job's root cause back; a root cause on
    another node is this node's summary and exit code."""

    def after(code: int, result: object, say: Callable[[str], None]) -> int:
        try:
            root = link.end(code, ended_how(code, result), _Ticker(say))
        except _Interrupted:  # a stop signal while node 0 waits for the others: the store stops now
            return code
        for note in link.poll()[1]:
            say(f"ddpboot: note: {note}")
        if root is None or root.node == link.node:
            return code
        say(summary(root, link.node))
        return root.code

    return after


def ended_how(code: int, result: object) -> str:
    """How this node's job ended, for the other nodes, when no rank's failure says it."""
    stop = getattr(result, "stop_signal", None)
    if stop is not None:
        return f"its launcher was stopped by {signal.Signals(stop).name} (exit code {code})"
    return f"its job ended with exit code {code}"


class _Ticker:
    """Node 0's wait for the other nodes' ends: said once after NOTICE_AFTER s; a stop signal ends it."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.since = time.monotonic()
        self.said = False

    def __call__(self, what: Callable[[], str]) -> None:
        if STOP_SIGNALS & signal.sigpending():
            raise _Interrupted
        if not self.said and time.monotonic() - self.since >= NOTICE_AFTER:
            self.said = True
            self.say(f"ddpboot: {what()}; Ctrl-C (SIGINT) or SIGTERM ends the wait")


class _Interrupted(Exception):
    pass
