"""The run's files are the job owner's only: a real `ddpboot --log-dir BASE` job makes BASE/RUN_ID and attempt_0
0700 and the rank logs 0600, keeps BASE's own mode, and (as root) a child of another uid can neither list nor read
them; `--log-mode shared` leaves them to the umask (docs/security.md)."""

from __future__ import annotations

import encodings.idna  # noqa: F401  (the child that drops to uid 65534 can no longer read the interpreter's files)
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import BEHAVE, as_uid, finish, launch_env, run_launcher, start_launcher, wait_for

NOBODY = 65534


@pytest.fixture
def team_dir() -> Iterator[Path]:
    """A directory every user can enter (0755 under /tmp): pytest's own tmp_path is 0700, which would keep another
    uid out whatever ddpboot does."""
    path = Path(tempfile.mkdtemp(prefix="ddpboot-shared-files-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _tries_as(uid: int, paths: list[Path]) -> list[str]:
    """What a forked child that dropped to `uid` gets when it lists each directory or reads each file."""

    def tries() -> list[str]:
        outcomes = []
        for path in paths:
            try:
                _ = os.listdir(path) if path.is_dir() else path.read_bytes()
                outcomes.append("read")
            except PermissionError:
                outcomes.append("denied")
        return outcomes

    return as_uid(uid, tries)


def test_the_run_directory_is_the_owners_only(tmp_path: Path, team_dir: Path) -> None:
    base = team_dir / "team"
    base.mkdir()
    os.chmod(base, 0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(out, tmp_path)
    proc = start_launcher(["--nproc", "2", "--cpu", "--log-dir", str(base), "--rdzv-id", "job", BEHAVE, "--lines",
                           "2", "--hold", "*"], env)
    try:
        wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)) or proc.poll() is not None, 60,
                 "both ranks to be ready")
        assert proc.poll() is None, f"the launcher exited (rc {proc.returncode}): {finish(proc)[2][-3000:]}"
        run = base / "job"
        attempt = run / "attempt_0"
        logs = sorted(attempt.glob("rank*.log"))
        modes = {p.name: oct(_mode(p)) for p in [run, attempt, *logs]}
        denied = _tries_as(NOBODY, [base, run, attempt, *logs]) if os.geteuid() == 0 else None
    finally:
        (out / "release").touch()
    rc, _, err = finish(proc)
    assert rc == 0, err[-3000:]
    assert modes == {"job": "0o700", "attempt_0": "0o700", "rank0.log": "0o600", "rank1.log": "0o600"}, modes
    assert _mode(base) == 0o755  # BASE may be shared on purpose: its mode is the user's
    if denied is not None:
        assert denied == ["read"] + ["denied"] * 4, denied  # BASE is open: the run's own modes keep them out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test drops a child to uid 65534 (CI runs as root)")
def test_another_uid_cannot_read_the_files_even_under_a_shared_umask(tmp_path: Path, team_dir: Path) -> None:
    (tmp_path / "out").mkdir()
    old = os.umask(0)  # the launcher inherits it: only the modes ddpboot chooses protect the files
    try:
        done = run_launcher(["--nproc", "1", "--cpu", "--log-dir", str(team_dir / "logs"), "--rdzv-id", "job",
                             BEHAVE, "--lines", "2"], launch_env(tmp_path / "out", tmp_path))
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr[-3000:]
    run = team_dir / "logs" / "job"
    assert _mode(team_dir / "logs") == 0o777  # made by the umask: BASE is the user's to share
    paths = [team_dir / "logs", run, run / "attempt_0" / "rank0.log"]
    assert _tries_as(NOBODY, paths) == ["read", "denied", "denied"]


def test_log_mode_shared_leaves_the_modes_to_the_umask(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    old = os.umask(0o022)
    try:
        done = run_launcher(["--nproc", "1", "--cpu", "--log-dir", str(tmp_path / "logs"), "--rdzv-id", "job",
                             "--log-mode", "shared", BEHAVE, "--lines", "2"], launch_env(tmp_path / "out", tmp_path))
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "logs" / "job"
    assert (_mode(run), _mode(run / "attempt_0"), _mode(run / "attempt_0" / "rank0.log")) == (0o755, 0o755, 0o644)
