"""The death observer on the fake clock of jobs.py, watching real child processes: what it records at a rank's
start, its samples, and what it publishes and writes at the attempt's end (the verdicts are why.py's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ddpboot.launch.observe.death import SAMPLE_INTERVAL, DeathCause, written_by_ddpboot
from ddpboot.launch.observe.status import RunStatus
from tests.unit.launch.observe.jobs import Attempt, Clock, job, worker


def test_a_rank_ended_by_another_process_is_published_and_written_to_its_error_file(tmp_path: Path) -> None:
    clock = Clock()
    j = job(tmp_path, clock, [])
    read: list[int] = []
    observer = DeathCause(j.status, clock, kmsg=lambda pid: (read.append(pid), (None, None))[1])
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(32 << 20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    w = worker(1, child.pid, run=tmp_path)
    w.error_file.parent.mkdir(parents=True)
    assert observer.due(clock.now) == clock.now  # a rank to record: at once
    observer.on_wake(clock.now, Attempt([w]))
    assert observer.due(clock.now) == clock.now + SAMPLE_INTERVAL
    seen = observer.watched[1]
    assert seen.pid == child.pid and seen.cpu_limit is not None and seen.peak_rss is not None
    os.kill(child.pid, signal.SIGTERM)
    _, w.status = os.waitpid(child.pid, 0)
    child.stdin.close()  # type: ignore[union-attr]
    observer.on_exit(w)
    observer.on_root(w)
    w.signalled = ["SIGTERM (rank 1 failed)"]  # noted by the decisions after its death
    assert isinstance(j.status, RunStatus) and j.status.causes == {}  # said at the attempt's end, not before
    observer.close()
    cause = j.status.causes[1]
    assert cause.startswith("rank 1 was ended by SIGTERM from another process: ddpboot did not send it")
    data = json.loads(w.error_file.read_text())
    assert data["message"]["message"] == f"ddpboot: {cause}" and data["errorCode"] == 143
    assert written_by_ddpboot(w.error_file)
    assert j.status.snapshot([w]).ranks[0].cause == cause
    assert read == []  # the kernel log is read for a SIGKILL only


def test_what_ddpboot_sent_is_named_and_a_rank_s_own_error_file_is_kept(tmp_path: Path) -> None:
    clock = Clock()
    j = job(tmp_path, clock, [])
    observer = DeathCause.start(j)
    w = worker(0, 0, run=tmp_path)
    w.error_file.parent.mkdir(parents=True)
    w.error_file.write_text('{"message": "its own"}')
    w.status, w.signalled = signal.SIGKILL, ["SIGKILL (shutdown timeout)"]  # a wait status: killed by SIGKILL
    observer.kmsg = lambda pid: (None, "the kernel log cannot be read (test)")
    observer.on_exit(w)  # never recorded: died before the first wake-up
    observer.close()
    assert isinstance(j.status, RunStatus)
    assert j.status.causes[0] == "rank 0 was killed by ddpboot, which sent it SIGKILL (shutdown timeout)"
    assert w.error_file.read_text() == '{"message": "its own"}' and not written_by_ddpboot(w.error_file)


def test_a_rank_that_exited_with_a_code_gets_no_cause(tmp_path: Path) -> None:
    clock = Clock()
    j = job(tmp_path, clock, [])
    observer = DeathCause.start(j)
    w = worker(0, 0, run=tmp_path)
    w.status = 1 << 8  # exit code 1
    observer.on_exit(w)
    observer.close()
    assert isinstance(j.status, RunStatus) and j.status.causes == {} and not w.error_file.exists()
