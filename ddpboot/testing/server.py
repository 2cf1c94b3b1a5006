"""The session server: `python -m ddpboot.testing.server`, one per pytest session (per xdist worker), started by
session.py (the plugin's users know it as the warm process; `ddpboot --warm`'s is another, warmserver.py). It holds
a fast-start zygote (launch/faststart/) that has imported torch, ddpboot and the session's test files once; for
each test it forks a launcher that supervises that test's ranks, forked in turn from the zygote.

Each test still gets the launcher's guarantees: fresh rank processes, its own store on its own port (bound to a
free port by the launcher), GPU locks taken and waited for as any job's (so xdist workers never share a GPU),
fail-fast, the shutdown timeout, no orphans (this process is a child subreaper; everything dies with the pytest
process), and the job's exit code.

Protocol, one JSON object per line: pytest → here {"nproc", "gpu", "results", "timeout"}; here → pytest
{"op": "ready"} or {"op": "error", "error"} once at the start, then per test {"op": "started", "pid"} and
{"op": "done", "code"}. The test's launcher writes its output to the results directory's launcher.log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import IO, Any

import ddpboot.launch.supervisor  # noqa: F401  (imported once here, not by every test's launcher)
from ddpboot.errors import DdpbootError
from ddpboot.launch import runner
from ddpboot.launch.config import RunOptions, SelectionOptions, build
from ddpboot.launch.faststart import FastStartError, FastStartProcess
from ddpboot.launch.procs.spawn import PR_SET_PDEATHSIG, become_subreaper, prctl
from ddpboot.launch.pymain import TargetKind
from ddpboot.launch.spec import Target
from ddpboot.selection.gpu import Inventory
from ddpboot.testing.job import LAUNCHER_LOG, PRELOAD_VAR

RANK_MODULE = "ddpboot.testing.rank"
# A CPU test's launcher plans with no GPUs instead of reading the machine's: no NVML, no GPU lock, no GPU watch.
CPU_TEST = Inventory((), "none", ("the test asked for CPU ranks: the machine's GPUs were not read",))
SHUTDOWN_TIMEOUT = 5.0  # seconds a stopped rank gets before SIGKILL


def rank_target(results: str) -> Target:
    return Target(TargetKind.MODULE, RANK_MODULE, (results,))


def run_job(zygote: FastStartProcess, nproc: int, gpu: bool, results: str, wait: float) -> int:
    """One test's job: the launcher's own run path (launch/runner.py, as `ddpboot --fast-start -m
    ddpboot.testing.rank` would run it) with the session's zygote instead of a fresh one. GPUs are planned and locked
    as any job's, and GPUs held by another job (another xdist worker) are waited for up to `wait` s."""
    options = RunOptions(
        script=RANK_MODULE, args=(results,), module=True, fast_start=True,
        selection=SelectionOptions(nproc=str(nproc), cpu=not gpu), shutdown_timeout=SHUTDOWN_TIMEOUT,
        wait_for_gpus=f"{wait}s" if gpu and wait > 0 else None,
    )
    return runner.run(build(options, dict(os.environ), Path.cwd()), fast_start=zygote,
                      gpus=None if gpu else CPU_TEST)


def _job_process(req: dict[str, Any], zygote: FastStartProcess, protocol: list[IO[Any]]) -> None:
    """The forked test launcher: output into the results directory, the job, its exit code. Never returns."""
    code = 1
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for f in protocol:
            f.close()
        log = os.open(Path(req["results"]) / LAUNCHER_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        code = run_job(zygote, int(req["nproc"]), bool(req["gpu"]), str(req["results"]), float(req["timeout"]))
    except DdpbootError as exc:
        print(f"ddpboot: error: {exc}", file=sys.stderr)
        code = 2
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, zygote: FastStartProcess) -> int:
    """The test launcher's exit code; reaps whatever else comes (orphans, the zygote if it died)."""
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if got == zygote.pid:
            zygote.gone = True
        if got == pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def serve(zygote: FastStartProcess, requests: IO[str], replies: IO[str]) -> None:
    def send(msg: dict[str, Any]) -> None:
        replies.write(json.dumps(msg) + "\n")
        replies.flush()

    try:
        zygote.wait_ready()
    except FastStartError as exc:
        send({"op": "error", "error": str(exc)})
        return
    send({"op": "ready"})
    for line in requests:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _job_process(json.loads(line), zygote, [requests, replies])
        send({"op": "started", "pid": pid})
        send({"op": "done", "code": _wait(pid, zygote)})
        if zygote.gone:
            return


def main() -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # with the pytest process
    become_subreaper()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the zygote and the test files print at import goes to the log, not into the protocol
    env = dict(os.environ)
    os.environ.pop(PRELOAD_VAR, None)
    zygote = FastStartProcess.start(sys.executable, rank_target(""), Path.cwd(), env,
                                    preload=("ddpboot.testing.preload",))
    try:
        serve(zygote, sys.stdin, replies)
    finally:
        zygote.close()


if __name__ == "__main__":
    main()
