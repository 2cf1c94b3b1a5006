"""What counts as left behind by a job (leftovers.py's pure decisions), and the /proc reading on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.launch.procs import leftovers
from ddpboot.launch.procs.leftovers import Proc

RUN = Path("/tmp/ddpboot-abc")
UID = 1000
LAUNCHER = 100


def proc(pid: int, ppid: int, error_file: str | None = None, uid: int = UID, cmd: str = "x") -> Proc:
    return Proc(pid, ppid, uid, pid * 10, cmd, error_file)


def table(*procs: Proc) -> dict[int, Proc]:
    return {p.pid: p for p in procs}


def test_reparented_children_and_their_descendants_are_left_over_but_ours_are_not() -> None:
    t = table(
        proc(1, 0), proc(50, 1), proc(LAUNCHER, 50),
        proc(101, LAUNCHER, cmd="guardian"), proc(102, LAUNCHER, cmd="zygote"), proc(103, 102, cmd="zygote child"),
        proc(200, LAUNCHER, cmd="daemon"), proc(201, 200, cmd="its child"),
    )
    found = leftovers.leftovers(t, LAUNCHER, {101, 102}, RUN, UID)
    assert [p.pid for p in found] == [200, 201]


def test_below_the_process_that_forks_the_ranks_its_adopted_orphans_are_left_over_not_its_ranks() -> None:
    """A forked rank's daemon is the fast-start process's (or warm session's) child: it is a subreaper too."""
    t = table(
        proc(1, 0), proc(LAUNCHER, 1), proc(102, LAUNCHER, cmd="zygote"), proc(900, 1, cmd="warm session"),
        proc(103, 102, cmd="rank 0"), proc(104, 102, cmd="daemon of a rank"), proc(105, 104, cmd="its child"),
        proc(901, 900, cmd="rank 1"), proc(902, 900, cmd="daemon of a warm rank"), proc(903, 1, cmd="unrelated"),
    )
    found = leftovers.leftovers(t, LAUNCHER, {102, 103, 901}, RUN, UID, adopters=[102, 900])
    assert [p.pid for p in found] == [104, 105, 902]
    assert leftovers.leftovers(t, LAUNCHER, {102, 103, 901}, RUN, UID) == []  # without them: none of those


def test_marked_processes_are_found_anywhere_but_only_ours_and_only_this_run() -> None:
    mine = f"{RUN}/attempt_0/rank3.error.json"
    t = table(
        proc(1, 0), proc(LAUNCHER, 1),
        proc(300, 1, mine), proc(301, 1, mine, uid=0), proc(302, 1, "/tmp/ddpboot-abcd/attempt_0/rank0.error.json"),
        proc(303, 1, "/elsewhere/rank0.error.json"), proc(304, 1),
        proc(101, LAUNCHER, mine),  # ours although marked (cannot be: still never ended)
    )
    found = leftovers.leftovers(t, LAUNCHER, {101}, RUN, UID)
    assert [p.pid for p in found] == [300]
    assert leftovers.rank_of(found[0]) == 3


def test_a_relative_run_directory_marks_nothing() -> None:
    """`logs/RUN` could be another job's, started in another directory: only an absolute directory marks."""
    t = table(proc(300, 1, "logs/run/attempt_0/rank0.error.json"))
    assert leftovers.marked(t, Path("logs/run"), UID) == set()


def test_never_the_launcher_nor_init_even_if_marked() -> None:
    mark = f"{RUN}/attempt_0/rank0.error.json"
    t = table(proc(1, 0, mark), proc(LAUNCHER, 1, mark))
    assert leftovers.leftovers(t, LAUNCHER, set(), RUN, UID) == []


def test_one_note_names_each_rank_its_processes_and_how_they_ended() -> None:
    a = proc(300, 1, f"{RUN}/attempt_0/rank1.error.json", cmd="sleep 120")
    b = proc(301, 1, f"{RUN}/attempt_0/rank0.error.json", cmd="python -m http.server")
    c = proc(302, 1, f"{RUN}/attempt_0/rank1.error.json", cmd="x" * 200)
    d = proc(303, LAUNCHER, None, cmd="env-less")
    note = leftovers.describe([a, b, c, d], killed=[302])
    assert note.startswith("ddpboot: rank 0 left 1 process running: pid 301 (python -m http.server); "
                           "rank 1 left 2 processes running: pid 300 (sleep 120), pid 302 (" + "x" * 71 + "…); "
                           "a rank left 1 process running: pid 303 (env-less); SIGKILL after the grace for pid 302")
    assert "ended with SIGTERM" in leftovers.describe([a])
    assert "ended with SIGKILL at once (the launcher was told to stop)" in leftovers.describe([a], at_once=True)


def test_snapshot_reads_a_real_process_its_mark_and_end_stops_it(tmp_path: Path) -> None:
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(tmp_path / "attempt_0" / "rank2.error.json"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "tag"], env=env)
    try:
        t = leftovers.snapshot()
        assert leftovers.marked(t, tmp_path, os.getuid()) == {child.pid}
        p = t[child.pid]
        assert p.ppid == os.getpid() and p.cmd.endswith("-c import time; time.sleep(60) tag")
        assert leftovers.rank_of(p) == 2 and child.pid in leftovers.children(os.getpid())
        assert leftovers.end([p], grace=10.0) == ([child.pid], [])  # SIGTERM was enough
        assert leftovers.read_proc(child.pid) is None  # ended, and reaped (it is our child)
    finally:
        child.kill()
        child.wait()


def test_end_uses_sigkill_after_the_grace_and_never_signals_a_reused_pid(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        p = leftovers.read_proc(child.pid)
        assert p is not None
        stale = Proc(p.pid, p.ppid, p.uid, p.start + 1, p.cmd)  # the same pid, another process's start time
        assert leftovers.end([stale], grace=0.0) == ([], []) and child.poll() is None
        assert leftovers.end([p], grace=0.2) == ([child.pid], [child.pid])
        assert leftovers.read_proc(child.pid) is None
    finally:
        child.kill()
        child.wait()


def test_without_pidfds_plain_pids_are_signalled_after_the_same_check(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (or seccomp filter) without pidfd_open: the process is still ended, by pid, and a reused pid still
    is not."""
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        wait_until = leftovers.read_proc(child.pid)
        assert wait_until is not None
        stale = Proc(wait_until.pid, wait_until.ppid, wait_until.uid, wait_until.start + 1, wait_until.cmd)
        assert leftovers.end([stale], grace=0.0) == ([], []) and child.poll() is None
        assert leftovers.end([wait_until], grace=5.0) == ([child.pid], [])
        assert leftovers.read_proc(child.pid) is None
    finally:
        child.kill()
        child.wait()
