"""Finding a running job for `ddpboot stacks`: by run directory, pid or run id, or the only one running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.observe.stacks import find as finder
from ddpboot.launch.observe.stacks.find import RunRecord, find, publish, request_dump, unpublish
from ddpboot.launch.procs.procstat import start_of
from ddpboot.launch.rundir import RunPaths

ME = start_of(os.getpid())


def test_a_run_directory_with_a_live_launcher_is_found_and_unpublished(tmp_path: Path) -> None:
    me = RunRecord(os.getpid(), "run-7", tmp_path, ME)
    publish(me)
    assert find(str(tmp_path)) == me
    unpublish(me)
    assert not (tmp_path / RunPaths.RECORD).exists()
    with pytest.raises(UsageError, match="is no running ddpboot job's pid"):
        find(str(tmp_path))


def test_a_dead_launchers_record_is_no_longer_running_and_removed(tmp_path: Path) -> None:
    publish(RunRecord(2**22 + 11, "run-8", tmp_path, 12345))  # no such process
    (tmp_path / RunPaths.STATUS).write_text("{}")
    with pytest.raises(UsageError, match=r"that job is no longer running: .* \(pid 4194315\) has exited; its stale "
                       "launcher.json and status.json removed"):
        find(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_record_whose_pid_is_now_another_process_is_not_signalled(tmp_path: Path) -> None:
    """This very process, under a start time that is not its own: the record's launcher is gone, whoever has the pid."""
    stale = RunRecord(os.getpid(), "run-10", tmp_path, (ME or 0) + 1)
    publish(stale)
    with pytest.raises(UsageError, match="that job is no longer running"):
        find(str(tmp_path))
    assert not (tmp_path / RunPaths.RECORD).exists()
    with pytest.raises(UsageError, match="no longer running"):
        request_dump(stale, 1.0)  # the signal would have killed this process (SIGUSR2's default)


def test_a_record_without_a_start_time_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / RunPaths.RECORD).write_text(f'{{"pid": {os.getpid()}, "run_id": "old", "run_dir": "{tmp_path}"}}')
    with pytest.raises(UsageError, match=r"without its start time .* it is left alone"):
        find(str(tmp_path))
    assert (tmp_path / RunPaths.RECORD).exists()


def test_without_run_the_only_job_or_a_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [RunRecord(11, "a", tmp_path), RunRecord(12, "b", tmp_path)]
    monkeypatch.setattr(finder, "running", lambda: jobs[:1])
    assert find(None) == jobs[0] and find("11") == jobs[0] and find("a") == jobs[0]
    monkeypatch.setattr(finder, "running", lambda: jobs)
    with pytest.raises(UsageError, match=r"2 ddpboot jobs are running: pid 11 \(run id a\); pid 12"):
        find(None)
    assert find("b") == jobs[1]
    monkeypatch.setattr(finder, "running", list)
    with pytest.raises(UsageError, match="no running ddpboot job of this user"):
        find(None)


def test_running_jobs_are_found_from_their_ranks_environment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    attempt = tmp_path / "attempt_0"
    attempt.mkdir()
    publish(RunRecord(os.getpid(), "run-9", tmp_path, ME))
    monkeypatch.setattr(finder, "stacks_paths", lambda: {attempt / "rank0.stacks", attempt / "rank1.stacks"})
    assert finder.running() == [RunRecord(os.getpid(), "run-9", tmp_path, ME)]


def test_a_rank_process_is_seen_through_proc(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ddpboot.contract import STACKS_VAR

    path = tmp_path / "attempt_0" / "rank3.stacks"
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             env={STACKS_VAR: f"37:{path}"})
    try:
        assert path in finder.stacks_paths()
    finally:
        child.communicate(b"")


READER = """
import json, sys, time
from pathlib import Path
path, torn, whole = Path(sys.argv[1]), 0, 0
print("ready", flush=True)
while not path.with_name("done").exists():
    try:
        text = path.read_text()
    except FileNotFoundError:
        continue
    try:
        json.loads(text)
        whole += 1
    except ValueError:
        torn += 1
print(torn, whole)
"""


def test_the_record_is_read_whole_while_it_is_written(tmp_path: Path) -> None:
    """Another process reading the record while the launcher writes it (`ddpboot stacks RUN_DIR` just after the
    start) finds it absent or whole, never empty or cut."""
    me = RunRecord(os.getpid(), "run-torn", tmp_path)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path / RunPaths.RECORD)], stdout=subprocess.PIPE,
                              text=True)
    assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
    for _ in range(3000):
        publish(me)
    (tmp_path / "done").touch()
    torn, whole = (int(n) for n in reader.communicate(timeout=60)[0].split())
    assert whole > 0 and torn == 0, f"{torn} torn reads of {torn + whole}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", RunPaths.RECORD]  # nothing half-written beside it
