"""The I/O of one attempt: one thread, one selectors loop over every worker's stdout/stderr pipe and a signalfd
carrying SIGCHLD and the handled signals. It reaps, pumps output, reads signals with their senders, feeds all of it
to the attempt's decisions (decisions.py) and to its observers (launch/observe/: the watch hook, the GPU watch,
--stall-timeout, the stack dumps, the status file), and carries out what the decisions decide, the observers'
answers included. The loop waits until the earliest of the decisions' deadlines and the observers' `due` times.

Nothing polls on a timer except the safety net while waiting for a stopped group to empty (`--monitor-interval`),
so a worker's exit is seen as soon as the kernel reports it.

No orphans, no zombies: the launcher is a child subreaper, so a worker's children that outlive it are reparented to
the launcher and reaped here; and if the launcher itself dies, the guardian kills every group
(ddpboot/launch/procs/guardian.py).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
from collections.abc import Callable, Sequence

from ddpboot.errors import DdpbootError
from ddpboot.launch.logs import Console, RankStream
from ddpboot.launch.observe.base import Observer, using
from ddpboot.launch.procs.groups import signal_group
from ddpboot.launch.procs.guardian import Guardian
from ddpboot.launch.procs.reap import exited
from ddpboot.launch.procs.signals import SignalFd, sender_name
from ddpboot.launch.procs.spawn import SpawnError
from ddpboot.launch.supervisor.decisions import Action, AttemptDecisions, DumpStacks, Say, SignalGroups
from ddpboot.launch.supervisor.report import report_unkillable
from ddpboot.launch.supervisor.starters import Starter
from ddpboot.launch.supervisor.workers import AttemptResult, Worker, exit_code_of
from ddpboot.procfs import read_stat

SIGNALS_KEY = "signals"  # the selector's data for the signalfd
PIPE_KEY = "pipe"  # ... for a worker's stdout/stderr pipe
CHUNK = 1 << 16


class RankStartError(DdpbootError):
    """A rank's program could not be started (exec failed); the ranks started before it are killed."""

    def __init__(self, rank: int, cause: SpawnError) -> None:
        super().__init__(f"rank {rank} {cause}")
        self.rank = rank
        self.cause = cause


class ProcessTable:
    """The launcher's children during the job: the current attempt's workers, the guardian, the starter's own."""

    def __init__(self, guardian: Guardian, starter: Starter, clock: Callable[[], float]) -> None:
        self.guardian = guardian
        self.starter = starter
        self.clock = clock
        self.workers: list[Worker] = []
        self.guardian_code: int | None = None  # the guardian's exit code once it died

    def reap(self) -> list[Worker]:
        """Reap every exited child (workers, reparented descendants, the guardian); return the workers."""
        done: list[Worker] = []
        running = {w.pid: w for w in self.workers if w.status is None}
        for pid, status in exited():
            if pid in running:
                self._exited(running[pid], status, done)
            elif pid == self.guardian.pid and self.guardian_code is None:
                self.guardian_code = exit_code_of(status)
            else:
                self.starter.child_exited(pid, status)
        for pid, status in self.starter.exits():
            if pid in running:
                self._exited(running[pid], status, done)
        return done

    def _exited(self, w: Worker, status: int, done: list[Worker]) -> None:
        w.status = status
        w.ended = self.clock()
        done.append(w)

    def emptied_groups(self) -> list[int]:
        """The workers (indexes) whose process group has just emptied; the guardian forgets them."""
        gone = []
        for i, w in enumerate(self.workers):
            if w.status is None or w.group_gone or not w.pid:
                continue
            try:
                signal_group(w.pid, 0)
            except ProcessLookupError:
                w.group_gone = True
                gone.append(i)
                if self.guardian_code is None:
                    with contextlib.suppress(OSError):
                        self.guardian.remove(w.pid)
            except PermissionError:
                pass
        return gone

    def signal_group(self, w: Worker, signo: int) -> None:
        if w.group_gone or not w.pid:  # never started (pid 0 would be killpg of the launcher's own group)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            signal_group(w.pid, signo)

    def kill_all(self) -> None:
        for w in self.workers:
            self.signal_group(w, signal.SIGKILL)

    def sent_by_worker(self, pid: int) -> bool:
        """Whether `pid` (a signal's sender) is inside one of the workers' process groups."""
        if pid <= 0:
            return False
        try:
            return os.getpgid(pid) in {w.pid for w in self.workers if not w.group_gone}
        except OSError:
            return False

    def start(self, sel: selectors.BaseSelector) -> dict[int, RankStream]:
        """Start the workers; their output pipes (read ends, registered with `sel`) and where each one goes. If one
        cannot start, those already started are killed and reaped."""
        pipes: dict[int, RankStream] = {}
        try:
            for w in self.workers:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                try:
                    w.pid = self.starter.start(w, out_w, err_w)
                except SpawnError as exc:
                    raise RankStartError(w.slot.rank, exc) from None
                finally:
                    os.close(out_w)
                    os.close(err_w)
                w.started = self.clock()
                stat = read_stat(w.pid)  # its identity, while it cannot have been reaped yet (or only just)
                w.pid_start = stat.start if stat is not None else None
                self.guardian.add(w.pid, w.pid_start)
                for fd, stream in ((out_r, w.out), (err_r, w.err)):
                    os.set_blocking(fd, False)
                    pipes[fd] = stream
                    sel.register(fd, selectors.EVENT_READ, PIPE_KEY)
        except BaseException:
            for fd in pipes:
                sel.unregister(fd)
                os.close(fd)
            self._kill_started()
            raise
        return pipes

    def _kill_started(self) -> None:
        for w in self.workers:
            if w.pid:
                self.signal_group(w, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(w.pid, 0)
            w.group_gone = True


class AttemptLoop:
    """Runs one attempt's workers to the end: events in, the decisions' actions out; the observers told what
    happens, and their answers handed to the decisions."""

    def __init__(self, procs: ProcessTable, sel: selectors.BaseSelector, sigfd: SignalFd, console: Console,
                 decisions: AttemptDecisions, observers: Sequence[Observer] = ()) -> None:
        self.procs = procs
        self.sel = sel
        self.sigfd = sigfd
        self.console = console
        self.clock = procs.clock
        self.decisions = decisions
        self.pipes: dict[int, RankStream] = {}
        # Only the hooks an observer overrides are called: the output hook runs for every read.
        self.timed = using(observers, "due")
        self.hearing = using(observers, "on_output")
        self.counting = using(observers, "on_exit")
        self.blaming = using(observers, "on_root")
        self.waking = using(observers, "on_wake")
        self.dumping = using(observers, "on_dump")
        self.root_told = False

    @property
    def workers(self) -> list[Worker]:
        return self.procs.workers

    @property
    def stopping(self) -> bool:
        return self.decisions.stopping

    def run(self, pipes: dict[int, RankStream]) -> AttemptResult:
        self.pipes = pipes
        while not self.decisions.done:
            self.carry_out(self.decisions.linger(self.clock()))
            self._wait()
            self._after_wait()
        # Every group is gone: whatever is still in the pipes was written before the end; a pipe still open is held
        # by a process that left its group (setsid), which we stop reading.
        for fd in list(self.pipes):
            self._pump(fd, final=True)
        return self._result()

    def _wait(self) -> None:
        silent = any(w.status is None and w.out.closed and w.err.closed for w in self.workers)
        # Exits read while a rank was being started are waiting: no blocking.
        if self.procs.starter.has_exits():
            timeout: float | None = 0.0
        else:
            now = self.clock()
            due = [t for o in self.timed if (t := o.due(now)) is not None]
            timeout = self.decisions.wait_time(now, silent, due)
        timeout = self.console.wait_time(timeout)  # a quiet progress bar's held-back state, due in a log
        for key, _ in self.sel.select(timeout):
            if key.data == SIGNALS_KEY:
                self._read_signals()
            elif key.data == PIPE_KEY:
                self._pump(key.fd)
            # the zygote's socket: its exit reports are read when reaping

    def _after_wait(self) -> None:
        self.console.show_due()
        d = self.decisions
        exited = self.procs.reap()
        self.carry_out(d.workers_exited([(self.workers.index(w), w.code) for w in exited], self.clock()))
        for w in exited:
            for o in self.counting:
                o.on_exit(w)
        self.carry_out(d.resolve_root(self.clock()))
        if d.root is not None and not self.root_told:
            self.root_told = True
            for o in self.blaming:
                o.on_root(self.workers[d.root])
        for i in self.procs.emptied_groups():
            d.group_gone(i)
        if self.procs.guardian_code is not None:
            d.guardian_died(self.procs.guardian_code)
        now = self.clock()
        self.carry_out(d.tick(now))
        for o in self.waking:
            answers = o.on_wake(now, self)
            if answers:
                self.carry_out(d.answered(answers, self.clock()))

    def _read_signals(self) -> None:
        for info in self.sigfd.read():
            if info.signo == signal.SIGCHLD:
                continue
            from_worker = self.procs.sent_by_worker(info.pid)
            self.carry_out(self.decisions.signal_received(info, self.clock(), sender_name(info.pid), from_worker))

    def carry_out(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, SignalGroups):
                for i in action.workers:
                    self.procs.signal_group(self.workers[i], action.signo)
            elif isinstance(action, Say):
                self.console.message(action.text)
            elif isinstance(action, DumpStacks):
                for o in self.dumping:
                    o.on_dump(action.reason, self.clock(), self)
            else:
                report_unkillable(self.workers, self.console)

    def _pump(self, fd: int, final: bool = False) -> None:
        stream = self.pipes[fd]
        while True:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                if not final:
                    return
                data = b""
            except InterruptedError:
                continue
            if not data:
                self.sel.unregister(fd)
                os.close(fd)
                del self.pipes[fd]
                stream.close()
                return
            stream.feed(data)
            for o in self.hearing:
                o.on_output(stream.rank, data)
            if not final and len(data) < CHUNK:
                return

    def _result(self) -> AttemptResult:
        d = self.decisions
        for w, state in zip(self.workers, d.ranks, strict=True):
            w.signalled = list(state.sent)
            w.close_output()
        return AttemptResult(
            code=d.exit_code(),
            root=None if d.root is None else self.workers[d.root],
            stop_signal=d.stop_signal,
            workers=self.workers,
            restart_reason=d.restart_reason,
        )
