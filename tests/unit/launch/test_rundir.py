"""The run directory (ddpboot/launch/rundir.py): its layout, never reused, private by default, the temporary log base
the user's own, and a disk without room refused before anything is made."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from ddpboot.contract import exit_mark, stacks_file
from ddpboot.errors import UsageError
from ddpboot.launch.logs import LogFile
from ddpboot.launch.rundir import RunPaths, rank_of_error_file, run_dir, temporary_log_base, write_first
from ddpboot.launch.spec import LogMode


def test_the_layout_of_a_run_directory() -> None:
    run = RunPaths(Path("/logs/job"))
    assert (run.plan, run.record, run.status) == (Path("/logs/job/plan.json"), Path("/logs/job/launcher.json"),
                                                  Path("/logs/job/status.json"))
    attempt = run.attempt(2)
    assert attempt.root == Path("/logs/job/attempt_2")
    assert (attempt.log(13), attempt.error_file(13)) == (Path("/logs/job/attempt_2/rank13.log"),
                                                          Path("/logs/job/attempt_2/rank13.error.json"))
    assert rank_of_error_file(str(attempt.error_file(13))) == 13
    assert rank_of_error_file(str(attempt.log(13))) is None and rank_of_error_file("") is None
    rnd = run.round(3)
    assert rnd.root == Path("/logs/job/round_3") and rnd.attempt(0).root == Path("/logs/job/round_3/attempt_0")
    # what a rank writes beside its error file (contract.py) leads back to its run directory, an elastic round's too
    for where in (run, rnd):
        rank_file = stacks_file(str(where.attempt(1).error_file(0)))
        assert rank_file == where.attempt(1).root / "rank0.stacks" and RunPaths.of_stacks_file(rank_file) == where
    assert exit_mark(str(attempt.error_file(0))) == attempt.root / "rank0.error.json.exiting"


def test_stack_dumps_are_numbered_from_1_and_never_overwritten(tmp_path: Path) -> None:
    run = RunPaths(tmp_path)
    assert run.next_dump() == (tmp_path / "stacks-1.txt", tmp_path / "stacks-1.json") and run.dumps() == set()
    (tmp_path / "stacks-1.txt").write_text("")  # written first; its JSON file comes last
    assert run.next_dump()[0] == tmp_path / "stacks-2.txt"
    (tmp_path / "stacks-2.json").write_text("{}")
    assert run.next_dump()[1] == tmp_path / "stacks-3.json" and run.dumps() == {tmp_path / "stacks-2.json"}


def test_run_dirs_are_never_reused(tmp_path: Path) -> None:
    first = run_dir(tmp_path / "logs", "job")
    second = run_dir(tmp_path / "logs", "job")
    assert first.name == "job" and second.name == "job.1" and first.is_dir() and second.is_dir()


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot create it"):
        run_dir(blocker / "logs", "job")


def test_a_private_run_dir_is_the_owners_only_and_its_base_keeps_its_mode(tmp_path: Path) -> None:
    base = tmp_path / "team-logs"
    base.mkdir(mode=0o775)
    os.chmod(base, 0o775)
    path = run_dir(base, "job")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(base.stat().st_mode) == 0o775
    attempt = path / "attempt_0"
    LogMode.PRIVATE.make_dir(attempt, exist_ok=True)
    LogMode.PRIVATE.make_dir(attempt, exist_ok=True)  # the next attempt of an elastic round may find it
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    log = LogFile(attempt / "rank0.log")
    log.close()
    assert stat.S_IMODE((attempt / "rank0.log").stat().st_mode) == 0o600


def test_a_shared_run_dir_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = run_dir(tmp_path / "logs", "job", LogMode.SHARED)
        log = LogFile(path / "rank0.log", LogMode.SHARED)
        log.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert stat.S_IMODE((path / "rank0.log").stat().st_mode) == 0o644


def test_the_temporary_log_base_is_the_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = temporary_log_base()
    assert base == tmp_path / f"ddpboot-logs-{os.getuid()}"
    first = run_dir(base, "job")
    assert first == base / "job" and stat.S_IMODE(base.stat().st_mode) == 0o700
    os.chmod(base, 0o777)  # writable by others: someone could swap the run's directories
    with pytest.raises(UsageError, match="not a directory of yours that only you can write"):
        run_dir(base, "job")
    os.chmod(base, 0o700)
    base.rename(tmp_path / "elsewhere")
    base.symlink_to(tmp_path / "elsewhere")  # a link is refused whatever it points to
    with pytest.raises(UsageError, match="Give --log-dir DIR, or remove it"):
        run_dir(base, "job")


def test_the_first_file_goes_with_its_directory_when_it_cannot_be_written(tmp_path: Path) -> None:
    where = run_dir(tmp_path / "logs", "job")
    write_first(where, False, "{}\n")
    assert RunPaths(where).plan.read_text() == "{}\n"
    other = run_dir(tmp_path / "logs", "job")
    (other / "plan.json").mkdir()  # the file cannot replace a directory: the write fails as on a full disk
    with pytest.raises(UsageError, match=r"cannot write .*/job.1/plan.json: Is a directory. Nothing was started"):
        write_first(other, False, "{}")
    assert not other.exists() and where.is_dir()
    with pytest.raises(UsageError, match="set TMPDIR to a directory with room"):
        write_first(tmp_path / "gone", True, "{}")
