"""The supervisor: starts the workers of each attempt, pumps their output, forwards signals, stops the group on the
first failure, restarts it if asked, and returns the job's exit code.

The parts: workers.py (each worker's command, environment and output routing), starters.py (fork + exec, or the
fast-start zygote), decisions.py (the pure rules: fail-fast, the shutdown timeout, the root cause, signals),
loop.py (the selectors loop that feeds them events and carries out their actions), report.py (what the user is
told); what watches the attempt while it runs is launch/observe/. This module runs the job: the guardian, the
signalfd, the attempts and the restarts between them.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping

from ddpboot.contract import STACKS_SIGNAL, STOP_SIGNALS, exit_mark
from ddpboot.launch import observe
from ddpboot.launch.faststart import FastStartProcess
from ddpboot.launch.logs import Console
from ddpboot.launch.observe.stacks.find import RunRecord, publish, unpublish
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.procs import leftovers
from ddpboot.launch.procs.guardian import Guardian, GuardianError, start_guardian
from ddpboot.launch.procs.procstat import start_of
from ddpboot.launch.procs.signals import ForwardPolicy, SignalFd, signal_label
from ddpboot.launch.procs.spawn import become_subreaper
from ddpboot.launch.rundir import RunPaths
from ddpboot.launch.spec import LaunchSpec, RunDir, Watch
from ddpboot.launch.supervisor.decisions import AttemptDecisions, AttemptOutcome, Timing, after_attempt, job_code
from ddpboot.launch.supervisor.loop import SIGNALS_KEY, AttemptLoop, ProcessTable, RankStartError
from ddpboot.launch.supervisor.report import failure_summary, no_join_report, rank_isolated_gpus
from ddpboot.launch.supervisor.starters import choose_starter
from ddpboot.launch.supervisor.workers import (
    AttemptResult,
    AttemptSetup,
    Worker,
    describe_status,
    make_workers,
)
from ddpboot.selection.planner import Plan

__all__ = ["AttemptResult", "Supervisor"]

MAX_LEFTOVER_GRACE = 30.0  # seconds a process left by a rank gets after SIGTERM (the shutdown timeout, at most this)


def exit_mark_time(w: Worker) -> float:
    """When the worker began to exit (its exit mark), or +inf without one."""
    try:
        return float(exit_mark(str(w.error_file)).read_text())
    except (OSError, ValueError):
        return float("inf")


class Supervisor:
    """Runs the attempts of one job (or one elastic round) on this node, from the spec and the plan.

    `listener` is the store's bound socket (the guardian serves it); `env` the environment the workers inherit;
    `run_dir` where attempts write. `before_start` runs once the store is up (the nodes' check-in,
    nodes/check.py); `watch` is asked while the workers run (elastic membership changes); `attempts` are the attempt
    numbers to run (0..--max-restarts; an elastic round runs the one its job has reached); `started_before` says
    that ranks of this job ran before (a later elastic round), which makes a rank that cannot start a failure
    (126/127) rather than a usage error (2)."""

    def __init__(
        self,
        spec: LaunchSpec,
        plan: Plan,
        listener: socket.socket,
        env: Mapping[str, str],
        run_dir: RunDir,
        *,
        fast_start: FastStartProcess | None = None,
        before_start: Callable[[], None] | None = None,
        watch: Watch | None = None,
        attempts: range | None = None,
        started_before: bool = False,
        after_job: Callable[[int, AttemptResult | None, Callable[[str], None]], int] | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.listener = listener
        # Absolute: the ranks' TORCHELASTIC_ERROR_FILE (and so the job's mark, procs/leftovers.py) must name this
        # job's directory, not `logs/RUN_ID` that another job started elsewhere with the same --log-dir may share.
        self.workdir = run_dir.path.absolute()
        self.paths = RunPaths(self.workdir)
        self.temporary = run_dir.temporary
        self.console = console or Console()
        self.clock = clock
        # MASTER_PORT: the port we serve on, or node 0's (multi-node, node rank > 0: our listener only serves the
        # guardian's unused local store).
        self.setup = AttemptSetup(spec, plan, dict(env), spec.master_port or int(listener.getsockname()[1]),
                                  self.console, with_files=not run_dir.temporary)
        self.before_start = before_start
        self.watch = watch  # asked while the ranks run (observe/watch.py)
        self.after_job = after_job  # (code, last result, say) → the job's code: the other nodes' verdict
        self.timing = Timing(spec.shutdown_timeout, spec.monitor_interval)
        self.result: AttemptResult | None = None  # the last attempt's
        self.fast_start = fast_start  # ranks forked by the fast-start process (launch/faststart/); None: exec
        self.attempts = attempts if attempts is not None else range(spec.max_restarts + 1)
        self.policy = ForwardPolicy(forward_stacks=STACKS_SIGNAL in spec.signals)
        self.sel = selectors.DefaultSelector()
        self.sigfd: SignalFd | None = None
        self.procs: ProcessTable | None = None
        self.started_before = started_before
        self.own: set[int] = set()  # the launcher's children that are not the job's: guardian, fast start, agent
        self.status = RunStatus(self.workdir, spec.run_id, plan.node_rank, plan.world_size, clock)  # `ddpboot top`

    # --- the job -----------------------------------------------------------------------------------

    def run(self) -> int:
        _wait_for_threads()
        become_subreaper()
        guardian = start_guardian(self.listener, self.spec.store, self.workdir if self.temporary else None,
                                  self.spec.store_allow, run_dir=self.workdir)
        self.listener.close()  # the guardian serves it now
        self.sigfd = SignalFd([*self.spec.signals, STACKS_SIGNAL, signal.SIGCHLD])
        self.sel.register(self.sigfd, selectors.EVENT_READ, SIGNALS_KEY)
        starter = None
        record = RunRecord(os.getpid(), self.spec.run_id, self.workdir.resolve(), start_of(os.getpid()))
        publish(record)
        try:
            starter = choose_starter(self.fast_start, self.spec.target, self.sel, self.console, self.spec.signals,
                                     self.spec.python)
            self.own = leftovers.children(os.getpid())
            self.procs = ProcessTable(guardian, starter, self.clock)
            if self.before_start is not None:
                self.before_start()
            code = self._attempts(self.procs, self.sigfd)
            if code == 0:  # a failure has its own report; a success that did nothing must not pass silently
                self._report_no_join(guardian)
            return code if self.after_job is None else self.after_job(code, self.result, self.console.message)
        finally:
            unpublish(record)
            self.status.remove()
            if starter is not None:
                starter.close()
            self._finish()
            guardian.quit()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(guardian.pid, 0)
            if self.procs is not None:
                self.procs.reap()

    def _attempts(self, procs: ProcessTable, sigfd: SignalFd) -> int:
        outcome = AttemptOutcome(self.attempts.start, 1)
        for attempt in self.attempts:
            if attempt != self.attempts.start:
                try:
                    procs.guardian.reset()
                except GuardianError as exc:
                    self.console.message(f"ddpboot: error: {exc}; not restarting")
                    return 1
            try:
                result = self._attempt(procs, sigfd, attempt)
            except RankStartError as exc:
                if not self.started_before and attempt == self.attempts.start:
                    raise  # nothing of the job ran: a usage error (exit 2), reported by the command line
                self.console.message(f"ddpboot: error: {exc} Not restarting (exit code {exc.cause.shell_code}).")
                return exc.cause.shell_code
            self.started_before = True
            self.result = result
            outcome = AttemptOutcome(attempt, result.code, result.stop_signal is not None, result.restart_reason,
                                     procs.guardian_code is not None)
            if result.root is not None and result.restart_reason is None:
                logs = None if self.temporary else self.paths.attempt(attempt).root
                cause = self.status.causes.get(result.root.slot.rank)
                self.console.message(failure_summary(result, attempt, self.spec.max_restarts, logs, cause))
            if after_attempt(outcome, self.attempts) == "finish":
                break
            self._end_leftovers()
            self._say_restart(result, attempt)
        return job_code(outcome)

    def _report_no_join(self, guardian: Guardian) -> None:
        """Rank isolation's one trap, said after the job: no rank ever joined (see no_join_report)."""
        if self.result is None or self.result.stop_signal is not None or not rank_isolated_gpus(self.plan):
            return
        if self.plan.nnodes > 1:  # the workers' store is node 0's, not this guardian's
            return
        try:
            joined = guardian.joined()
        except GuardianError:
            return
        if joined is False:
            self.console.message(no_join_report(self.plan))

    def _say_restart(self, result: AttemptResult, attempt: int) -> None:
        what = "?"
        if result.root is not None and result.root.status is not None:
            what = f"rank {result.root.slot.rank}: {describe_status(result.root.status)}"
        self.console.message(
            f"ddpboot: attempt {attempt} failed ({what}); restarting every rank, restart {attempt + 1} "
            f"of {self.spec.max_restarts} (TORCHELASTIC_RESTART_COUNT={attempt + 1})"
        )

    def _end_leftovers(self, hurry: leftovers.Hurry | None = None) -> None:
        """End what the attempt's ranks left running (leftovers.py): SIGTERM, the shutdown timeout (cut short by
        `hurry`), SIGKILL; SIGKILL at once after a second SIGINT. Below the launcher, and below the process that
        forked the ranks (fast start, a warm session), which adopts their orphans as the launcher does."""
        workers = {w.pid for w in self.procs.workers} if self.procs is not None else set()
        adopters = [self.fast_start.pid] if self.fast_start is not None else []
        found = leftovers.leftovers(leftovers.snapshot(), os.getpid(), self.own | workers, self.workdir, os.getuid(),
                                    adopters)
        if found:
            now = self.policy.hurried
            grace = 0.0 if now else min(self.spec.shutdown_timeout, MAX_LEFTOVER_GRACE)
            signalled, killed = leftovers.end(found, grace, first=signal.SIGKILL if now else signal.SIGTERM,
                                              hurry=hurry)
            if signalled:  # the others ended by themselves meanwhile
                self.console.message(leftovers.describe([p for p in found if p.pid in signalled], killed, now))

    def _finish(self) -> None:
        if self.procs is not None:
            self.procs.kill_all()
            self._end_leftovers(_StopCutsGrace(self.sigfd, self.console) if self.sigfd is not None else None)
        if self.sigfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.sigfd)
            self.sigfd.close()
        if self.temporary:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- one attempt -------------------------------------------------------------------------------

    def _attempt(self, procs: ProcessTable, sigfd: SignalFd, attempt: int) -> AttemptResult:
        paths = self.paths.attempt(attempt)
        self.spec.log_mode.make_dir(paths.root, exist_ok=True)
        workers = make_workers(self.setup, attempt, paths)
        procs.workers = workers
        pipes = procs.start(self.sel)
        decisions = AttemptDecisions([w.slot.rank for w in workers], self.timing, self.clock(), self.policy,
                                     lambda i: exit_mark_time(workers[i]))
        job = observe.Job(attempt, self.spec, self.plan, self.paths, self.temporary, self.setup.base_env,
                          self.setup.port, self.console.message, self.clock, self.status, self.watch)
        observers = observe.start(job)
        try:
            return AttemptLoop(procs, self.sel, sigfd, self.console, decisions, observers).run(pipes)
        finally:
            for o in observers:
                o.close()


class _StopCutsGrace:
    """leftovers.Hurry over the launcher's signalfd: while what the ranks left gets its grace at the job's end, a stop
    signal (a second Ctrl-C) means now."""

    def __init__(self, sigfd: SignalFd, console: Console) -> None:
        self.sigfd = sigfd
        self.console = console

    def fileno(self) -> int:
        return self.sigfd.fileno()

    def __call__(self) -> bool:
        stops = [i for i in self.sigfd.read() if i.signo in STOP_SIGNALS]
        if stops:
            self.console.message(f"ddpboot: received {signal_label(stops[0].signo)}: ending what the ranks left "
                                 "running now (SIGKILL)")
        return bool(stops)


def _wait_for_threads() -> None:
    """fork() + Python code before exec needs a launcher without Python threads. A helper thread that is finishing
    (a DNS lookup's pool after shutdown) gets a moment to end."""
    for t in threading.enumerate():
        if t is not threading.main_thread():
            t.join(timeout=2.0)
    if threading.active_count() > 1:
        raise RuntimeError(f"ddpboot bug: the launcher runs threads {threading.enumerate()} and cannot fork")
