"""The supervisor: starts the workers of each attempt, pumps their output, forwards signals, stops the group on the
first failure, restarts it if asked, and returns the job's exit code.

One thread, one selectors loop over: every worker's stdout/stderr pipe, and a signalfd carrying SIGCHLD and the
handled signals. Nothing polls on a timer except the safety net while waiting for a stopped group to empty
(`--monitor-interval`), so a worker's exit is seen as soon as the kernel reports it.

Fail-fast: the first worker to exit non-zero is the root cause; every other worker's process group gets SIGTERM and,
after `--shutdown-timeout` seconds, SIGKILL (on the failure path too, unlike torchrun 2.13's fixed 30 s). The exit
code is the root cause's (128+N when it died of signal N); when the launcher itself is stopped by a signal N, 128+N.

No orphans, no zombies: the launcher is a child subreaper, so a worker's children that outlive it are reparented to
the launcher and reaped; when every worker has exited (success too), processes left in a worker's group get SIGTERM,
then SIGKILL after the shutdown timeout; and if the launcher itself dies, the guardian kills every group
(guardian.py).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.contract import exit_mark
from ddpboot.launch.env import EnvContext, worker_argv, worker_env, worker_vars
from ddpboot.launch.faststart import FastStartError, Zygote
from ddpboot.launch.logs import Console, LogFile, RankStream, read_error_file
from ddpboot.launch.options import Std
from ddpboot.launch.procs.guardian import Guardian, GuardianError, start_guardian
from ddpboot.launch.procs.signals import ForwardPolicy, SignalFd, SignalInfo, sender_name
from ddpboot.launch.procs.spawn import become_subreaper, spawn
from ddpboot.launch.spec import LaunchSpec
from ddpboot.selection.planner import Plan, RankSlot

SUMMARY_LINES = 20
STUCK_REPORT = 5.0  # seconds after SIGKILL: name the processes that are still there, and what they wait on
LINGER = 1.0  # seconds a worker's leftover processes get to exit on their own once every rank has exited
# A rank fails while another rank had already begun to exit (ddpboot.init's at-exit mark): how long the exiting rank
# gets to finish before the failed one is taken as the root cause after all.
EXITING_GRACE = 5.0


def exit_code_of(status: int) -> int:
    """A wait status as a shell exit code: the code, or 128+N for death by signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        return f"killed by {name} (exit code {128 + sig})"
    return f"exit code {os.WEXITSTATUS(status)}"


def describe_gpus(slot: RankSlot) -> str:
    if not slot.gpus:
        return "CPU"
    return ", ".join(f"GPU {g.label} ({g.uuid[:12]}…)" if len(g.uuid) > 12 else f"GPU {g.label} ({g.uuid})"
                     for g in slot.gpus)


@dataclass(eq=False)
class Worker:
    slot: RankSlot
    argv: list[str]
    env: dict[str, str]
    error_file: Path
    out: RankStream
    err: RankStream
    log: LogFile | None = None
    pid: int = 0
    started: float = 0.0
    ended: float | None = None
    status: int | None = None  # the wait status once reaped
    signalled: list[str] = field(default_factory=list)  # what we sent it while stopping
    group_gone: bool = False

    @property
    def code(self) -> int:
        return 0 if self.status is None else exit_code_of(self.status)


@dataclass
class AttemptResult:
    code: int
    root: Worker | None = None  # the first worker that failed
    stop_signal: int | None = None  # the signal that stopped the job
    workers: list[Worker] = field(default_factory=list)
    restart_reason: str | None = None  # the watch callback stopped the attempt (e.g. an elastic membership change)


class Supervisor:
    def __init__(
        self,
        spec: LaunchSpec,
        plan: Plan,
        listener: socket.socket,
        base_env: Mapping[str, str],
        workdir: Path,
        temporary: bool,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        before_start: Callable[[], None] | None = None,
        watch: Callable[[], str | None] | None = None,
        watch_interval: float = 1.0,
        zygote: Zygote | None = None,
        attempts: range | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.listener = listener
        self.base_env = dict(base_env)
        self.workdir = workdir  # the run's log directory, or a temporary one (error files only)
        self.temporary = temporary
        self.console = console or Console()
        self.clock = clock
        # MASTER_PORT: the port we serve on, or node 0's (multi-node, node rank > 0: our listener only serves the
        # guardian's unused local store).
        self.port = spec.master_port or int(listener.getsockname()[1])
        self.before_start = before_start  # e.g. the nodes' check-in (nodes_check.py), once the store is served
        # Called every watch_interval seconds while workers run; a non-None reason stops the attempt (SIGTERM, then
        # SIGKILL after the shutdown timeout) and is recorded in the result (elastic membership changes).
        self.watch = watch
        self.watch_interval = watch_interval
        self.result: AttemptResult | None = None  # the last attempt's
        # Fast start: ranks are forked by the zygote (faststart.py), which reports their exits; None: fork+exec.
        self.zygote = zygote
        # The attempt numbers this supervisor runs (TORCHELASTIC_RESTART_COUNT, attempt_N, the summary's count):
        # 0..--max-restarts by default; an elastic round runs the one attempt its job has reached.
        self.attempts = attempts if attempts is not None else range(spec.max_restarts + 1)
        self.policy = ForwardPolicy(frozenset(int(s) for s in spec.signals))
        self.guardian: Guardian | None = None
        self.sigfd: SignalFd | None = None
        self.sel = selectors.DefaultSelector()
        self.workers: list[Worker] = []
        self.guardian_died: int | None = None

    # --- the job -----------------------------------------------------------------------------------

    def run(self) -> int:
        # fork() + Python code before exec needs a launcher without Python threads. A helper thread that is
        # finishing (a DNS lookup's pool after shutdown) gets a moment to end.
        for t in threading.enumerate():
            if t is not threading.main_thread():
                t.join(timeout=2.0)
        if threading.active_count() > 1:
            raise RuntimeError(f"ddpboot bug: the launcher runs threads {threading.enumerate()} and cannot fork")
        become_subreaper()
        self.guardian = start_guardian(self.listener, self.spec.store, self.workdir if self.temporary else None)
        self.listener.close()  # the guardian serves it now
        self.sigfd = SignalFd([*self.spec.signals, signal.SIGCHLD])
        self.sel.register(self.sigfd, selectors.EVENT_READ, "signals")
        code = 1
        try:
            if self.zygote is not None:
                self._await_zygote()
            if self.before_start is not None:
                self.before_start()
            for attempt in self.attempts:
                if attempt != self.attempts.start:
                    try:
                        self.guardian.reset()
                    except GuardianError as exc:
                        self.console.message(f"ddpboot: error: {exc}; not restarting")
                        return 1
                result = self._attempt(attempt)
                self.result = result
                code = result.code
                if result.restart_reason is not None:
                    break
                if result.root is not None:
                    self._summarize(result, attempt)
                if result.code == 0 or result.stop_signal is not None or self.guardian_died is not None:
                    break
                if attempt + 1 in self.attempts:
                    what = "?"
                    if result.root is not None and result.root.status is not None:
                        what = f"rank {result.root.slot.rank}: {describe_status(result.root.status)}"
                    self.console.message(
                        f"ddpboot: attempt {attempt} failed ({what}); restarting every rank, restart {attempt + 1} "
                        f"of {self.spec.max_restarts} (TORCHELASTIC_RESTART_COUNT={attempt + 1})"
                    )
            if self.guardian_died is not None:
                code = 1
        finally:
            self._finish()
        return code

    def _await_zygote(self) -> None:
        """Wait for the zygote's imports (the launcher's own start-up and the nodes' check-in overlap them). If it
        cannot start, the ranks start with exec, and the message says why."""
        assert self.zygote is not None
        try:
            info = self.zygote.wait_ready()
        except FastStartError as exc:
            self.console.message(f"ddpboot: fast start unavailable: {exc}; starting every rank with exec instead")
            self.zygote = None
            return
        self.sel.register(self.zygote.sock, selectors.EVENT_READ, "zygote")
        if os.environ.get("DDPBOOT_DEBUG"):
            self.console.message(f"ddpboot: fast start: zygote pid {info['pid']} imported torch {info['torch']} in "
                                 f"{info['import_s']:.2f} s ({info['modules']} modules, {info['threads']} threads)")

    def _finish(self) -> None:
        if self.zygote is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.zygote.sock)
        for w in self.workers:
            if not w.group_gone:
                with contextlib.suppress(OSError):
                    os.killpg(w.pid, signal.SIGKILL)
        if self.sigfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.sigfd)
            self.sigfd.close()
        if self.temporary:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.guardian is not None:
            self.guardian.quit()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.guardian.pid, 0)
        self._reap()

    # --- one attempt -------------------------------------------------------------------------------

    def _attempt(self, attempt: int) -> AttemptResult:
        assert self.guardian is not None
        adir = self.workdir / f"attempt_{attempt}"
        adir.mkdir(parents=True, exist_ok=True)
        ctx = EnvContext(
            master_addr=self.spec.master_addr,
            master_port=self.port,
            run_id=self.spec.run_id,
            role=self.spec.role,
            restart_count=attempt,
            max_restarts=self.spec.max_restarts,
            signals=",".join(s.name for s in self.spec.signals),
        )
        routing = self.spec.routing
        self.workers = []
        for slot in self.plan.ranks:
            error_file = adir / f"rank{slot.rank}.error.json"
            log = None
            if not self.temporary and (routing.to_file(slot.local_rank, Std.OUT) or
                                       routing.to_file(slot.local_rank, Std.ERR)):
                log = LogFile(adir / f"rank{slot.rank}.log")

            def stream(which: Std, slot: RankSlot = slot, log: LogFile | None = log) -> RankStream:
                return RankStream(
                    slot.rank, which,
                    self.console if routing.to_console(slot.local_rank, which) else None,
                    log if routing.to_file(slot.local_rank, which) else None,
                    prefix=routing.prefix,
                )

            own = worker_vars(self.plan, slot, ctx, self.base_env, str(error_file))
            self.workers.append(Worker(
                slot=slot,
                argv=worker_argv(self.spec.target, self.spec.python, slot.local_rank),
                env=worker_env(self.base_env, own),
                error_file=error_file,
                out=stream(Std.OUT),
                err=stream(Std.ERR),
                log=log,
            ))
        pipes: dict[int, tuple[Worker, RankStream]] = {}
        try:
            for w in self.workers:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                try:
                    if self.zygote is not None:
                        w.pid = self.zygote.fork_rank(self.spec.target, w.slot.local_rank, w.env, out_w, err_w,
                                                      cpus=w.slot.cpus)
                    else:
                        w.pid = spawn(w.argv, w.env, out_w, err_w, cpus=w.slot.cpus)
                finally:
                    os.close(out_w)
                    os.close(err_w)
                w.started = self.clock()
                self.guardian.add(w.pid)
                for fd, st in ((out_r, w.out), (err_r, w.err)):
                    os.set_blocking(fd, False)
                    pipes[fd] = (w, st)
                    self.sel.register(fd, selectors.EVENT_READ, "pipe")
        except BaseException:
            for fd in pipes:
                self.sel.unregister(fd)
                os.close(fd)
            for w in self.workers:
                if w.pid:
                    with contextlib.suppress(OSError):
                        os.killpg(w.pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(w.pid, 0)
                    w.group_gone = True
            raise
        return self._loop(pipes)

    def _loop(self, pipes: dict[int, tuple[Worker, RankStream]]) -> AttemptResult:
        result = AttemptResult(code=0, workers=self.workers)
        stopping = False
        kill_at: float | None = None

        def stop(sig: int | None, why: str) -> None:
            nonlocal stopping, kill_at
            if stopping:
                return
            stopping = True
            kill_at = self.clock() + self.spec.shutdown_timeout
            for w in self.workers:
                if not w.group_gone:
                    if sig is not None:
                        self._signal(w, sig)
                    w.signalled.append(why)

        leaders_done_at: float | None = None
        report_at: float | None = None  # when to say which processes survive SIGKILL
        # (the rank that failed, ranks that were already exiting when it did, until when to wait for them)
        pending: tuple[Worker, list[Worker], float] | None = None
        watch_at = self.clock() + self.watch_interval if self.watch is not None else None
        while True:
            now = self.clock()
            leaders_done = all(w.status is not None for w in self.workers)
            groups_done = all(w.group_gone for w in self.workers)
            if leaders_done and groups_done:
                break
            if leaders_done and leaders_done_at is None:
                leaders_done_at = now
            lingered = now - (leaders_done_at or now) >= min(LINGER, self.spec.shutdown_timeout)
            if leaders_done and not stopping and lingered:
                # Every worker has exited (success, or the root cause already stopping the rest): anything left in a
                # worker's group (a daemon, a data-loader worker) is stopped as torchrun stops its groups at the end.
                left = [w for w in self.workers if not w.group_gone]
                self.console.message(
                    "ddpboot: every rank has exited but processes remain in the process group of rank"
                    f"{'s' if len(left) > 1 else ''} {', '.join(str(w.slot.rank) for w in left)}: sending SIGTERM "
                    f"(SIGKILL after {self.spec.shutdown_timeout:g} s)"
                )
                stop(signal.SIGTERM, "SIGTERM (left running after its rank exited)")
            timeout: float | None = None
            if kill_at is not None:
                timeout = max(kill_at - now, 0.0)
            if report_at is not None:
                timeout = max(min(report_at - now, timeout if timeout is not None else 1e9), 0.0)
            if any(w.status is not None and not w.group_gone for w in self.workers) or any(
                w.status is None and w.out.closed and w.err.closed for w in self.workers
            ):
                # Waiting for a group to empty, or for the exit of a worker whose pipes have closed (a GPU process
                # can take a while between closing its descriptors and exiting, and its SIGCHLD may be taken by a
                # foreign thread that does not block it): re-check on a short tick.
                timeout = min(timeout if timeout is not None else 1e9, self.spec.monitor_interval)
            if watch_at is not None:
                timeout = max(min(watch_at - now, timeout if timeout is not None else 1e9), 0.0)
            if pending is not None:
                timeout = max(min(pending[2] - now, timeout if timeout is not None else 1e9), 0.0)
            if self.zygote is not None and self.zygote.exits:
                timeout = 0.0  # exits read while a rank was being started
            for key, _ in self.sel.select(timeout):
                if key.data == "signals":
                    for info in self.sigfd.read() if self.sigfd else []:
                        if info.signo == signal.SIGCHLD:
                            continue
                        decision = self._on_signal(info)
                        if decision is None:
                            continue
                        sig, kill_now, send = decision
                        if result.root is None and result.stop_signal is None:
                            result.stop_signal = sig
                        stop(signal.SIGTERM if send else None, f"{signal.Signals(sig).name} to the launcher")
                        if kill_now:
                            kill_at = self.clock()
                elif key.data == "pipe":
                    self._pump(key.fd, pipes)
                elif key.data == "zygote":
                    pass  # its exit reports are read by _reap, below
            for w in self._reap():
                if w.code != 0 and result.root is None and not stopping and pending is None:
                    exiting = self._exiting(w)
                    if exiting:
                        # Probably a consequence: a rank that was already leaving tore down the process group under
                        # it. Wait for that rank's own exit before naming the root cause (nobody is signalled yet).
                        pending = (w, exiting, self.clock() + min(EXITING_GRACE, self.spec.shutdown_timeout))
                        continue
                    result.root = w
                    stop(signal.SIGTERM, f"SIGTERM (rank {w.slot.rank} failed)")
            if pending is not None and result.root is None and not stopping:
                first, exiting, until = pending
                failed = [e for e in exiting if e.status is not None and e.code != 0]
                if failed or all(e.status is not None for e in exiting) or self.clock() >= until:
                    pending = None
                    # The earliest to begin exiting is the root cause (`first` keeps it when no mark says otherwise).
                    root = min([first, *failed], key=self._exit_mark)
                    result.root = root
                    stop(signal.SIGTERM, f"SIGTERM (rank {root.slot.rank} failed)")
            elif pending is not None:
                pending = None
            self._check_groups()
            if watch_at is not None and self.watch is not None and self.clock() >= watch_at:
                watch_at = None if stopping else self.clock() + self.watch_interval
                reason = None if stopping else self.watch()
                if reason is not None and not stopping:
                    result.restart_reason = reason
                    self.console.message(f"ddpboot: {reason}; stopping every rank of this node to restart")
                    stop(signal.SIGTERM, f"SIGTERM ({reason})")
            if kill_at is not None and self.clock() >= kill_at:
                for w in self.workers:
                    if not w.group_gone:
                        self._signal(w, signal.SIGKILL)
                        w.signalled.append(f"SIGKILL after {self.spec.shutdown_timeout:g} s")
                kill_at = None
                report_at = self.clock() + STUCK_REPORT
            if report_at is not None and self.clock() >= report_at:
                report_at = None
                self._report_unkillable()
            if self.guardian_died is not None and not stopping:
                self.console.message(
                    f"ddpboot: error: the guardian process (store server) exited with {self.guardian_died}; "
                    "stopping the job"
                )
                stop(signal.SIGTERM, "SIGTERM (the store server died)")
        # Every group is gone: whatever is still in the pipes was written before the end; a pipe still open is held
        # by a process that left its group (setsid), which we stop reading.
        for fd in list(pipes):
            self._pump(fd, pipes, final=True)
        for w in self.workers:
            w.out.close()
            w.err.close()
            if w.log is not None:
                w.log.close()
        if result.root is not None:
            result.code = result.root.code
        elif result.stop_signal is not None:
            result.code = 128 + result.stop_signal
        elif self.guardian_died is not None:
            result.code = 1
        else:
            result.code = next((w.code for w in self.workers if w.code), 0)
        return result

    # --- events ------------------------------------------------------------------------------------

    def _pump(self, fd: int, pipes: dict[int, tuple[Worker, RankStream]], final: bool = False) -> None:
        _, stream = pipes[fd]
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                if not final:
                    return
                data = b""
            except InterruptedError:
                continue
            if not data:
                self.sel.unregister(fd)
                os.close(fd)
                del pipes[fd]
                stream.close()
                return
            stream.feed(data)
            if not final and len(data) < (1 << 16):
                return

    def _reap(self) -> list[Worker]:
        """Reap every exited child (workers, reparented descendants, the guardian); return the workers."""
        done: list[Worker] = []
        by_pid = {w.pid: w for w in self.workers if w.status is None}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            w = by_pid.get(pid)
            if w is not None:
                w.status = status
                w.ended = self.clock()
                done.append(w)
            elif self.guardian is not None and pid == self.guardian.pid and self.guardian_died is None:
                self.guardian_died = exit_code_of(status)
            elif self.zygote is not None and pid == self.zygote.pid:
                # Its ranks die with it (PR_SET_PDEATHSIG) and come to us, their subreaper, to be reaped.
                self.zygote.gone = True
                self.console.message(f"ddpboot: error: the fast-start process (pid {pid}) died: "
                                     f"{describe_status(status)}; its ranks are killed with it")
        if self.zygote is not None:  # ranks forked by the zygote: it reaps them and reports their statuses
            for pid, status in self.zygote.poll():
                w = by_pid.get(pid)
                if w is not None:
                    w.status = status
                    w.ended = self.clock()
                    done.append(w)
            if self.zygote.gone:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.zygote.sock)
        return done

    @staticmethod
    def _exit_mark(w: Worker) -> float:
        """When the worker began to exit (its at-exit mark), or +inf without one."""
        try:
            return float(exit_mark(str(w.error_file)).read_text())
        except (OSError, ValueError):
            return float("inf")

    def _exiting(self, failed: Worker) -> list[Worker]:
        """Workers that had begun to exit when `failed` was seen to fail: still running, or reaped in the same
        batch with a failure of their own."""
        return [w for w in self.workers
                if w is not failed and (w.status is None or w.code != 0) and self._exit_mark(w) != float("inf")]

    def _check_groups(self) -> None:
        for w in self.workers:
            if w.status is None or w.group_gone:
                continue
            try:
                os.killpg(w.pid, 0)
            except ProcessLookupError:
                w.group_gone = True
                if self.guardian is not None and self.guardian_died is None:
                    with contextlib.suppress(OSError):
                        self.guardian.remove(w.pid)
            except PermissionError:
                pass

    def _report_unkillable(self) -> None:
        """Processes that outlive SIGKILL are stuck in the kernel (typically a GPU driver call): say which, and
        where, since the launcher can only wait for them."""
        import psutil  # only on this rare path: the launcher stays light

        groups = {w.pid: w for w in self.workers if not w.group_gone}
        lines = []
        for proc in psutil.process_iter(["pid", "status", "name"]):
            try:
                pgid = os.getpgid(proc.info["pid"])
            except OSError:
                continue
            if pgid in groups:
                try:
                    with open(f"/proc/{proc.info['pid']}/wchan") as f:
                        wchan = f.read().strip() or "?"
                except OSError:
                    wchan = "?"
                lines.append(f"  rank {groups[pgid].slot.rank}: pid {proc.info['pid']} ({proc.info['name']}), state "
                             f"{proc.info['status']}, in {wchan}")
        if lines:
            self.console.message(
                f"ddpboot: {len(lines)} process{'es' if len(lines) > 1 else ''} still alive {STUCK_REPORT:g} s after "
                "SIGKILL (stuck in the kernel; waiting for them):\n" + "\n".join(lines)
            )

    def _signal(self, w: Worker, sig: int) -> None:
        if w.group_gone:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, sig)

    def _on_signal(self, info: SignalInfo) -> tuple[int, bool, bool] | None:
        """Apply the forwarding policy; returns (signal, kill now, SIGTERM needed) when the job must stop."""
        name = sender_name(info.pid)
        from_worker = False
        if info.pid > 0:
            with contextlib.suppress(OSError):
                from_worker = os.getpgid(info.pid) in {w.pid for w in self.workers if not w.group_gone}
        decision = self.policy.decide(info, self.clock(), name, from_worker)
        label = signal.Signals(info.signo).name
        sender = "the terminal or the kernel" if info.pid == 0 else f"pid {info.pid} ({name or '?'})"
        self.console.message(f"ddpboot: received {label} from {sender}: {decision.why}")
        if decision.forward:
            for w in self.workers:
                self._signal(w, info.signo)
                if decision.stop:
                    w.signalled.append(f"{label} (forwarded)")
        if decision.kill:
            for w in self.workers:
                self._signal(w, signal.SIGKILL)
                w.signalled.append("SIGKILL (second SIGINT)")
            return info.signo, True, False
        if decision.stop:
            # Workers that got neither our forward nor the sender's own delivery are asked to stop with SIGTERM.
            return info.signo, False, decision.terminate_workers
        return None

    # --- reporting ---------------------------------------------------------------------------------

    def _summarize(self, result: AttemptResult, attempt: int) -> None:
        root = result.root
        assert root is not None and root.status is not None
        slot = root.slot
        ran = (root.ended or 0.0) - root.started
        restarts = self.spec.max_restarts
        when = ""
        if restarts:
            left = restarts - attempt
            when = f" on attempt {attempt} ({left} restart{'s' if left != 1 else ''} left)"
        lines = [
            f"ddpboot: rank {slot.rank} failed{when}: {describe_status(root.status)}",
            f"  local rank {slot.local_rank} · {describe_gpus(slot)} · pid {root.pid} · ran {ran:.2f} s",
            f"  command: {shlex.join(root.argv)}",
        ]
        recorded = read_error_file(root.error_file)
        if recorded:
            lines.append("  traceback (recorded by @record in TORCHELASTIC_ERROR_FILE):")
            lines.extend("  | " + ln for ln in recorded.splitlines()[-60:])
        else:
            tail = root.err.last_lines(SUMMARY_LINES)
            which = "stderr"
            if not tail:
                tail, which = root.out.last_lines(SUMMARY_LINES), "stdout"
            if tail:
                lines.append(f"  last lines of its {which}:")
                lines.extend("  | " + ln for ln in tail)
            else:
                lines.append("  it printed nothing.")
        others = [w for w in result.workers if w is not root]
        if others:
            parts = []
            for w in others:
                how = describe_status(w.status) if w.status is not None else "?"
                if w.signalled:
                    how += f" after {', '.join(dict.fromkeys(w.signalled))}"
                parts.append(f"rank {w.slot.rank}: {how}")
            lines.append("  other ranks: " + "; ".join(parts))
        if not self.temporary:
            lines.append(f"  logs: {self.workdir / f'attempt_{attempt}'}")
        self.console.message("\n".join(lines))
