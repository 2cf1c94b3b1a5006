"""What an observer of a running job is: the hooks the attempt loop (launch/supervisor/loop.py) calls, what an
observer is started from (`Job`), what it sees of the ranks (`Rank`, `Running`) and what it may answer.

The loop calls, for every observer of the attempt (observe/__init__.py's OBSERVERS, in that order):

- `due(now)`: the time (the loop's monotonic clock) by which the observer wants the loop to wake, None for no
  wish; the loop waits no longer than the earliest of these and the decisions' own deadlines
  (supervisor/decisions.py `wait_time`);
- `on_output(rank, data)`: each piece read from a rank's stdout or stderr, as read (keep it cheap: it runs for every
  read);
- `on_exit(worker)`: a rank was reaped (its `status` and `code` are set);
- `on_root(worker)`: the rank the decisions took as the attempt's root cause, once;
- `on_wake(now, running)`: after every wake-up, once the decisions have had their turn: look (at most when due),
  and answer what the decisions should do (an `End`, a `Restart`, a `Stalled`, an EndJob) or nothing;
- `on_dump(reason, now, running)`: the decisions asked for every running rank's stack (DumpStacks);
- `close()`: the attempt is over.

Every hook has a default that does nothing; the loop calls only the hooks an observer overrides. An observer never
signals a process or prints a decision of its own: what it answers goes through the decisions, which stay pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ddpboot.launch.logs import RankStream
from ddpboot.launch.rundir import RunPaths
from ddpboot.launch.spec import EndJob, LaunchSpec, Watch
from ddpboot.selection.planner import Plan, RankSlot


class Rank(Protocol):
    """What an observer sees of one worker (supervisor/workers.py's Worker)."""

    slot: RankSlot
    pid: int  # 0: not started
    pid_start: int | None  # its start time (procfs): the pid and this name the process
    started: float  # the loop's clock
    ended: float | None
    status: int | None  # the wait status once reaped
    signalled: list[str]  # what the launcher sent it while stopping (set when the attempt ends)
    error_file: Path
    out: RankStream
    err: RankStream

    @property
    def code(self) -> int: ...


class Running(Protocol):
    """The attempt as the loop runs it."""

    @property
    def workers(self) -> Sequence[Rank]: ...

    @property
    def stopping(self) -> bool:
        """The attempt is being stopped (a failure, a signal, an answer): nothing more to ask for."""
        ...


@dataclass(frozen=True)
class End:
    """End the attempt with exit code `code` (SIGTERM to every rank, SIGKILL after the shutdown timeout)."""

    code: int
    why: str


@dataclass(frozen=True)
class Restart:
    """Stop every rank of this node for a restart, the attempt's restart reason (an elastic job's new member)."""

    reason: str


@dataclass(frozen=True)
class Stalled:
    """No progress for `timeout` seconds (--stall-timeout): dump every rank's stack, then stop the job."""

    timeout: float
    why: str


Answer = End | Restart | Stalled | EndJob


class Observer:
    """One thing that watches a running attempt. Subclass it, override the hooks it needs (module docstring), and
    give it a `start(job)` that returns one for the attempt, or None when it has nothing to watch."""

    def due(self, now: float) -> float | None:
        return None

    def on_output(self, rank: int, data: bytes) -> None:
        return None

    def on_exit(self, worker: Rank) -> None:
        return None

    def on_root(self, worker: Rank) -> None:
        return None

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        return ()

    def on_dump(self, reason: str, now: float, running: Running) -> None:
        return None

    def close(self) -> None:
        return None


def using(observers: Sequence[Observer], hook: str) -> list[Observer]:
    """The observers that override `hook` (the others' would do nothing: the loop does not call them)."""
    default = getattr(Observer, hook)
    return [o for o in observers if getattr(type(o), hook) is not default]


class Status(Protocol):
    """The job's status file (observe/status.py), one for every attempt of the launcher."""

    def begin(self, attempt: int) -> None: ...

    def warn(self, text: str) -> None: ...

    def explain(self, rank: int, text: str) -> None:
        """Why `rank` died (observe/death.py): the summary's `why:` line, status.json's `cause`."""
        ...

    def phases(self, rank: int, table: dict[str, float]) -> None:
        """`rank`'s start-up phases, seconds each (observe/startup.py): status.json's `phases`."""
        ...

    def phase(self, rank: int, name: str | None) -> None:
        """The start-up phase `rank` is in now (None: its group is up): status.json's `phase`, top's column."""
        ...

    def straggler(self, rank: int | None, text: str | None) -> None:
        """The rank named the straggler now (None: none), with what `ddpboot top` shows of it."""
        ...


@dataclass(frozen=True)
class Job:
    """What an observer is started from: one attempt of this launcher's job."""

    attempt: int
    spec: LaunchSpec
    plan: Plan
    paths: RunPaths  # the run directory
    temporary: bool  # the run directory goes at the end (no --log-dir)
    env: Mapping[str, str]  # the environment the ranks inherit
    port: int  # MASTER_PORT
    say: Callable[[str], None]  # a line on the launcher's console
    clock: Callable[[], float]  # the loop's monotonic clock
    status: Status
    watch: Watch | None = None  # the launcher's watch hook: the node link, an elastic round's membership

    def warn(self, text: str) -> None:
        """Say it, and keep it among status.json's warnings (what `ddpboot top` shows under the table)."""
        self.say(text)
        self.status.warn(text)
