"""What the supervisor decides during one attempt, as a pure state machine: events and the clock in, actions out.

Events: workers exited (with their exit codes), a signal reached the launcher, a worker's process group emptied,
an observer answered (launch/observe/: the watch hook, --gpu-watch strict, --stall-timeout), the guardian died,
time passed. Actions: signal these workers' process groups, print a message, dump the ranks' stacks, name the
processes that survive SIGKILL. The I/O loop (loop.py) feeds the events and carries out the actions; nothing here
touches a process, a file or the real clock, so every rule can be tested with a fake clock. The observers'
deadlines are the loop's too: `wait_time` takes the times they are due.

Fail-fast: the first worker to exit non-zero is the root cause; every other worker's process group gets SIGTERM and,
after exactly `--shutdown-timeout` seconds, SIGKILL (on the failure path too, unlike torchrun 2.13's fixed 30 s). The
exit code is the root cause's (128+N when it died of signal N); when the launcher itself is stopped by a signal N,
128+N; when the guardian (the store server) died, 1; otherwise the first non-zero code of a rank, or 0.

The root cause is the rank that began to exit first. A rank that called `ddpboot.init()` writes an exit mark
(ddpboot/contract.py `exit_mark`) when it starts to exit with a failure; a rank that fails while another had already
begun to exit is probably a consequence (the leaving rank tore the process group down under it), so the verdict
waits up to EXITING_GRACE seconds (at most the shutdown timeout) for the leaving ranks, then takes the earliest mark.

When every rank has exited, processes left in a worker's group (a daemon, a data-loader worker) get LINGER seconds
to go on their own, then SIGTERM and, after the shutdown timeout, SIGKILL, as torchrun stops its groups at the end.

Stack dumps (DumpStacks; launch/observe/stacks/): on STACKS_SIGNAL; before ranks that outlived the shutdown timeout
get SIGKILL (not after a second SIGINT: that kills at once, and says so); on SLURM's SIGTERM; and with
`--stall-timeout`, when no rank made progress for that long (observe/stall.py says what progress is and answers
Stalled).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ddpboot.launch.observe.base import Answer, End, Stalled
from ddpboot.launch.procs.signals import ForwardPolicy, SignalInfo, signal_label
from ddpboot.launch.spec import EndJob

STUCK_REPORT = 5.0  # seconds after SIGKILL: name the processes that are still there, and what they wait on
LINGER = 1.0  # seconds a worker's leftover processes get to exit on their own once every rank has exited
# A rank fails while another rank had already begun to exit: how long the exiting rank gets to finish before the
# failed one is taken as the root cause after all.
EXITING_GRACE = 5.0


@dataclass(frozen=True)
class SignalGroups:
    """Send `signo` to the process groups of these workers (indexes; a group already gone is skipped)."""

    workers: tuple[int, ...]
    signo: int


@dataclass(frozen=True)
class Say:
    """A message of the launcher's own on the console."""

    text: str


@dataclass(frozen=True)
class ReportStuck:
    """Name the processes still alive STUCK_REPORT seconds after SIGKILL (stuck in the kernel)."""


@dataclass(frozen=True)
class DumpStacks:
    """Dump every running rank's stack (ddpboot/launch/observe/stacks/), saying why."""

    reason: str


Action = SignalGroups | Say | ReportStuck | DumpStacks


@dataclass(frozen=True)
class Timing:
    shutdown_timeout: float  # SIGTERM → SIGKILL
    monitor_interval: float  # the re-check tick while waiting for a process group to empty


@dataclass
class RankState:
    """The decisions' view of one worker."""

    rank: int
    code: int | None = None  # the exit code once it has exited
    group_gone: bool = False
    sent: list[str] = field(default_factory=list)  # what the launcher sent it while stopping

    @property
    def exited(self) -> bool:
        return self.code is not None


@dataclass(frozen=True)
class PendingRoot:
    """Worker `first` failed while the workers `exiting` had begun to exit: the verdict waits for them until `until`."""

    first: int
    exiting: tuple[int, ...]
    until: float


@dataclass
class Deadlines:
    kill: float | None = None  # SIGKILL every group still there
    report: float | None = None  # name the processes that survived SIGKILL
    ranks_done: float | None = None  # when the last rank exited (the leftover processes' linger starts)


class AttemptDecisions:
    """One attempt's decisions. `exit_mark(i)`: when worker i began to exit (its exit mark), +inf without one."""

    def __init__(self, ranks: Sequence[int], timing: Timing, now: float, policy: ForwardPolicy,
                 exit_mark: Callable[[int], float]) -> None:
        self.ranks = [RankState(r) for r in ranks]
        self.timing = timing
        self.policy = policy
        self.exit_mark = exit_mark
        self.deadlines = Deadlines()
        self.pending: PendingRoot | None = None
        self.stopping = False
        self.root: int | None = None  # the index of the root cause
        self.stop_signal: int | None = None  # the signal that stopped the job
        self.restart_reason: str | None = None  # the watch hook's reason to stop the attempt
        self.guardian_code: int | None = None  # the guardian's exit code, if it died
        self.stalled = False  # --stall-timeout stopped the attempt
        self.dumped_stopping = False  # the stacks were dumped while stopping (once is enough)
        self.forced_code: int | None = None  # the launcher ended the attempt itself with this code (--gpu-watch)

    # --- state -----------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Every worker has exited and its process group is empty: the attempt is over."""
        return all(r.exited for r in self.ranks) and all(r.group_gone for r in self.ranks)

    def exit_code(self) -> int:
        if self.forced_code is not None:
            return self.forced_code
        if self.root is not None:
            return self.ranks[self.root].code or 0
        if self.stop_signal is not None:
            return 128 + self.stop_signal
        if self.guardian_code is not None:
            return 1
        return next((r.code for r in self.ranks if r.code), 0)

    def wait_time(self, now: float, silent_worker: bool = False, due: Iterable[float] = ()) -> float | None:
        """How long the loop may wait for an event: until the next deadline (the observers' `due` times among
        them), or one monitor tick while a group is emptying or a worker whose pipes have closed has not been seen
        to exit (`silent_worker`); None: no limit."""
        times = [t for t in (self.deadlines.kill, self.deadlines.report) if t is not None]
        times.extend(due)
        if self.pending is not None:
            times.append(self.pending.until)
        wait = max(min(times) - now, 0.0) if times else None
        if silent_worker or any(r.exited and not r.group_gone for r in self.ranks):
            wait = min(wait if wait is not None else math.inf, self.timing.monitor_interval)
        return wait

    def _live(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.ranks) if not r.group_gone)

    def _note(self, workers: Iterable[int], what: str) -> None:
        for i in workers:
            self.ranks[i].sent.append(what)

    def _stop(self, signo: int | None, why: str, now: float) -> list[Action]:
        """Stop the attempt (once): `signo` to every live group (None: they have it already), SIGKILL later."""
        if self.stopping:
            return []
        self.stopping = True
        self.deadlines.kill = now + self.timing.shutdown_timeout
        live = self._live()
        self._note(live, why)
        return [SignalGroups(live, signo)] if signo is not None and live else []

    def _fail(self, i: int, now: float) -> list[Action]:
        self.root = i
        return self._stop(signal.SIGTERM, f"SIGTERM (rank {self.ranks[i].rank} failed)", now)

    # --- events ----------------------------------------------------------------------------------------

    def linger(self, now: float) -> list[Action]:
        """Every rank has exited: after LINGER seconds, stop what remains in their groups."""
        if not all(r.exited for r in self.ranks):
            return []
        if self.deadlines.ranks_done is None:
            self.deadlines.ranks_done = now
        if self.stopping or now - self.deadlines.ranks_done < min(LINGER, self.timing.shutdown_timeout):
            return []
        left = [r.rank for r in self.ranks if not r.group_gone]
        say = Say("ddpboot: every rank has exited but processes remain in the process group of rank"
                  f"{'s' if len(left) > 1 else ''} {', '.join(str(r) for r in left)}: sending SIGTERM "
                  f"(SIGKILL after {self.timing.shutdown_timeout:g} s)")
        return [say, *self._stop(signal.SIGTERM, "SIGTERM (left running after its rank exited)", now)]

    def signal_received(self, info: SignalInfo, now: float, sender: str | None, from_worker: bool) -> list[Action]:
        """A signal reached the launcher from `sender` (its command name); `from_worker`: sent from inside one of
        the workers' process groups."""
        decision = self.policy.decide(info, now, sender, from_worker)
        label = signal_label(info.signo)
        who = "the terminal or the kernel" if info.pid == 0 else f"pid {info.pid} ({sender or '?'})"
        actions: list[Action] = [Say(f"ddpboot: received {label} from {who}: {decision.why}")]
        everyone = tuple(range(len(self.ranks)))
        # Every rank has exited: the signal stops nothing of the job (its code stays the ranks'), and what they left
        # running gets no grace.
        over = decision.stop and all(r.exited for r in self.ranks)
        kill = decision.kill or over
        if decision.dump:
            actions.append(DumpStacks(f"{label} from {who}"))
            self.dumped_stopping = self.dumped_stopping or decision.stop
        if decision.forward:
            actions.append(SignalGroups(everyone, info.signo))
            if decision.stop:
                self._note(everyone, f"{label} (forwarded)")
        if kill:
            self.policy.hurried = True
            actions.append(SignalGroups(everyone, signal.SIGKILL))
            self._note(everyone, "SIGKILL (second SIGINT)" if decision.kill else f"SIGKILL ({label}, ranks done)")
        elif not decision.stop:
            return actions
        if self.root is None and self.stop_signal is None and not over:
            self.stop_signal = info.signo
        # Workers that got neither our forward nor the sender's own delivery are asked to stop with SIGTERM.
        terminate = decision.terminate_workers and not kill
        actions += self._stop(signal.SIGTERM if terminate else None, f"{label} to the launcher", now)
        if kill:  # "now": SIGKILL is sent; no shutdown timeout left, no dump of ranks killed on purpose
            self.dumped_stopping = True
            self.deadlines.kill = None
            self.deadlines.report = now + STUCK_REPORT
        return actions

    def workers_exited(self, exits: Sequence[tuple[int, int]], now: float) -> list[Action]:
        """Workers reaped together: (index, exit code) each. The first failure is the root cause, unless other
        workers had begun to exit (then the verdict waits: see `resolve_root`)."""
        for i, code in exits:
            self.ranks[i].code = code
        actions: list[Action] = []
        for i, code in exits:
            if code == 0 or self.root is not None or self.stopping or self.pending is not None:
                continue
            exiting = tuple(j for j, r in enumerate(self.ranks)
                            if j != i and (not r.exited or r.code != 0) and self.exit_mark(j) != math.inf)
            if exiting:
                # Nobody is signalled yet: the leaving rank's own exit decides.
                grace = min(EXITING_GRACE, self.timing.shutdown_timeout)
                self.pending = PendingRoot(i, exiting, now + grace)
                continue
            actions += self._fail(i, now)
        return actions

    def resolve_root(self, now: float) -> list[Action]:
        """The verdict waited for: once a leaving rank failed, all have exited, or the grace is over, the earliest
        to begin exiting is the root cause (the first failure when no mark says otherwise)."""
        pending = self.pending
        if pending is None:
            return []
        if self.root is not None or self.stopping:
            self.pending = None
            return []
        failed = [e for e in pending.exiting if self.ranks[e].exited and self.ranks[e].code != 0]
        if not (failed or all(self.ranks[e].exited for e in pending.exiting) or now >= pending.until):
            return []
        self.pending = None
        return self._fail(min([pending.first, *failed], key=self.exit_mark), now)

    def group_gone(self, i: int) -> None:
        self.ranks[i].group_gone = True

    def guardian_died(self, code: int) -> None:
        self.guardian_code = code

    def answered(self, answers: Iterable[Answer], now: float) -> list[Action]:
        """What an observer answered (launch/observe/base.py), in order; nothing once the attempt is stopping."""
        actions: list[Action] = []
        for answer in answers:
            actions += self._answer(answer, now)
        return actions

    def _answer(self, answer: Answer, now: float) -> list[Action]:
        if self.stopping:
            return []
        if isinstance(answer, Stalled):
            return self._stalled(now, answer.timeout, answer.why)
        if isinstance(answer, End):
            return self.end_attempt(answer.code, answer.why, now)
        if isinstance(answer, EndJob):  # another node failed: this node's ranks stop, with its exit code
            self.restart_reason = answer.text
            return [Say(answer.text), *self.end_attempt(answer.code, answer.text, now)]
        reason = answer.reason  # Restart
        self.restart_reason = reason
        say = Say(f"ddpboot: {reason}; stopping every rank of this node to restart")
        return [say, *self._stop(signal.SIGTERM, f"SIGTERM ({reason})", now)]

    def tick(self, now: float) -> list[Action]:
        """Deadlines: SIGKILL after the shutdown timeout, the report on survivors; a dead guardian stops the job."""
        actions: list[Action] = []
        if self.deadlines.kill is not None and now >= self.deadlines.kill:
            live = self._live()
            running = [self.ranks[i].rank for i in live if not self.ranks[i].exited]
            if running and not self.dumped_stopping:
                self.dumped_stopping = True
                ranks = ", ".join(map(str, running))
                actions.append(DumpStacks(f"rank{'s' if len(running) > 1 else ''} {ranks} still running "
                                          f"{self.timing.shutdown_timeout:g} s after being asked to stop"))
            if live:
                actions.append(SignalGroups(live, signal.SIGKILL))
            self._note(live, f"SIGKILL after {self.timing.shutdown_timeout:g} s")
            self.deadlines.kill = None
            self.deadlines.report = now + STUCK_REPORT
        if self.deadlines.report is not None and now >= self.deadlines.report:
            self.deadlines.report = None
            actions.append(ReportStuck())
        if self.guardian_code is not None and not self.stopping:
            actions.append(Say(f"ddpboot: error: the guardian process (store server) exited with "
                               f"{self.guardian_code}; stopping the job"))
            actions += self._stop(signal.SIGTERM, "SIGTERM (the store server died)", now)
        return actions

    def end_attempt(self, code: int, why: str, now: float) -> list[Action]:
        """The launcher ends the attempt itself (`--gpu-watch strict`): SIGTERM to every rank, exit code `code`."""
        if self.stopping:
            return []
        self.forced_code = code
        return self._stop(signal.SIGTERM, f"SIGTERM ({why})", now)

    def _stalled(self, now: float, timeout: float, why: str) -> list[Action]:
        """--stall-timeout: no progress for `timeout` seconds (observe/stall.py): dump every rank's stack, then
        stop the job."""
        self.stalled = True
        self.dumped_stopping = True
        t = f"{timeout:g} s"
        say = Say(f"ddpboot: no progress for {t} ({why}): --stall-timeout {timeout:g}; dumping every "
                  "rank's stack, then stopping the job")
        return [say, DumpStacks(f"no progress for {t}, --stall-timeout"),
                *self._stop(signal.SIGTERM, f"SIGTERM (no progress for {t}, --stall-timeout)", now)]


# --- between attempts ----------------------------------------------------------------------------------

Verdict = Literal["finish", "restart"]


@dataclass(frozen=True)
class AttemptOutcome:
    attempt: int
    code: int
    stopped_by_signal: bool = False
    restart_reason: str | None = None  # the watch hook stopped it: the caller decides what comes next
    guardian_died: bool = False


def after_attempt(outcome: AttemptOutcome, attempts: range) -> Verdict:
    """Restart every rank after a failure while `attempts` has one more; a success, a stop signal, a dead guardian
    or a watch hook's stop ends the job (the job's code is then the last attempt's, 1 when the guardian died)."""
    if outcome.restart_reason is not None or outcome.code == 0 or outcome.stopped_by_signal or outcome.guardian_died:
        return "finish"
    return "restart" if outcome.attempt + 1 in attempts else "finish"


def job_code(last: AttemptOutcome) -> int:
    return 1 if last.guardian_died else last.code
