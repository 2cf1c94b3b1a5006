"""One attempt's workers as data: what each runs, where its output goes, how it ended; and the attempt's result."""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.launch.env import EnvContext, worker_argv, worker_env, worker_vars
from ddpboot.launch.logs import Console, LogFile, RankStream
from ddpboot.launch.rundir import AttemptPaths
from ddpboot.launch.spec import LaunchSpec, Std
from ddpboot.selection.planner import Plan, RankSlot


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
    pid_start: int | None = None  # its start time (/proc/PID/stat): the pid and this name the process
    started: float = 0.0
    ended: float | None = None
    status: int | None = None  # the wait status once reaped
    signalled: list[str] = field(default_factory=list)  # what the launcher sent it while stopping
    group_gone: bool = False

    @property
    def code(self) -> int:
        return 0 if self.status is None else exit_code_of(self.status)

    def close_output(self) -> None:
        self.out.close()
        self.err.close()
        if self.log is not None:
            self.log.close()


@dataclass
class AttemptResult:
    code: int
    root: Worker | None = None  # the first worker that failed
    stop_signal: int | None = None  # the signal that stopped the job
    workers: list[Worker] = field(default_factory=list)
    restart_reason: str | None = None  # the watch callback stopped the attempt (e.g. an elastic membership change)


@dataclass(frozen=True)
class AttemptSetup:
    """What the workers of one attempt are built from."""

    spec: LaunchSpec
    plan: Plan
    base_env: dict[str, str]
    port: int  # MASTER_PORT
    console: Console
    with_files: bool  # per-rank log files (False: a temporary directory holds only the error files)


def workers_torch(spec: LaunchSpec) -> tuple[int, int] | None:
    """The workers' torch release (major, minor), which says what the flight recorder's variables are called:
    known only where they run the launcher's own interpreter (not a PYTHON_EXEC of its own, not a --no-python
    binary, whose torch may be another)."""
    same = spec.target.kind != "binary" and os.path.realpath(spec.python) == os.path.realpath(sys.executable)
    return installed_torch() if same else None


@functools.cache
def installed_torch() -> tuple[int, int] | None:
    """The installed torch's release (major, minor), from the package's metadata: the launcher never imports torch.
    None where it cannot say (no torch here, a version it cannot read)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = re.match(r"(\d+)\.(\d+)", version("torch"))
    except PackageNotFoundError:
        return None
    return None if found is None else (int(found[1]), int(found[2]))


def make_workers(setup: AttemptSetup, attempt: int, paths: AttemptPaths) -> list[Worker]:
    spec = setup.spec
    ctx = EnvContext(
        master_addr=spec.master_addr,
        master_port=setup.port,
        run_id=spec.run_id,
        role=spec.role,
        restart_count=attempt,
        max_restarts=spec.max_restarts,
        signals=",".join(s.name for s in spec.signals),
        trace_dir=str(paths.root.resolve()) if setup.with_files else "",
        torch=workers_torch(spec) if setup.with_files else None,
    )
    return [_make_worker(setup, ctx, slot, paths) for slot in setup.plan.ranks]


def _make_worker(setup: AttemptSetup, ctx: EnvContext, slot: RankSlot, paths: AttemptPaths) -> Worker:
    routing = setup.spec.routing
    error_file = paths.error_file(slot.rank)
    log = None
    if setup.with_files and (routing.to_file(slot.local_rank, Std.OUT) or routing.to_file(slot.local_rank, Std.ERR)):
        log = LogFile(paths.log(slot.rank), setup.spec.log_mode, setup.console.log_trouble)

    def stream(which: Std) -> RankStream:
        return RankStream(
            slot.rank, which,
            setup.console if routing.to_console(slot.local_rank, which) else None,
            log if routing.to_file(slot.local_rank, which) else None,
            prefix=routing.line_prefix(slot.rank, slot.local_rank, setup.plan.node_rank),
            group=routing.group_prefix(), slot=(slot.local_rank, setup.plan.node_rank),
        )

    own = worker_vars(setup.plan, slot, ctx, setup.base_env, str(error_file))
    return Worker(
        slot=slot,
        argv=worker_argv(setup.spec.target, setup.spec.python, slot.local_rank),
        env=worker_env(setup.base_env, own),
        error_file=error_file,
        out=stream(Std.OUT),
        err=stream(Std.ERR),
        log=log,
    )
