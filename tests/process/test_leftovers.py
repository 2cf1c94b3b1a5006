"""Nothing a rank starts outlives the job: a daemon made by the classic double fork (`fork(); setsid(); fork()`),
which leaves the rank's process group and session, is ended when the job ends (the launcher is a child subreaper:
the daemon is reparented to it), and after a SIGKILL of the launcher (the guardian finds it by the job's mark in
its environment). The launcher says once which rank left which process. Each test counts the daemons still alive.

The same holds for ranks forked by the fast-start process and by a warm session (`--fast-start`, `--warm`), with
daemons that exec and daemons that do not (a forked rank's no-exec daemon carries no mark in /proc: the process
that forked the ranks is their subreaper, and ends everything below it when the launcher is gone).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.launch.procs.procstat import is_process
from tests.support import SCRIPTS, TIMEOUT, ddpboot_exe, launch_env, run_launcher, wait_for

DAEMON = str(SCRIPTS / "leave_daemon.py")
MODES = {"exec": [], "fast_start": ["--fast-start"], "warm": ["--warm"]}


def daemons(out: Path) -> list[int]:
    """The daemons the job's ranks wrote down that are still alive (a pid reused since is not one: the start time
    written beside it must still be its own)."""
    alive = []
    for path in out.glob("daemon*.pid"):
        pid, start = (int(w) for w in path.read_text().split())
        if is_process(pid, start):
            alive.append(pid)
    return alive


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def warm_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """launch_env with a warm directory of the test's own, whose warm process (if a test started one) is stopped."""
    env = launch_env(tmp_path, DDPBOOT_WARM_DIR=str(tmp_path / "warm"))
    yield env
    run_launcher(["warm", "stop"], env)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("daemon", [[], ["--no-exec"]], ids=["exec_daemon", "no_exec_daemon"])
def test_a_double_forked_daemon_ends_with_the_job(mode: str, daemon: list[str], tmp_path: Path,
                                                  warm_env: dict[str, str]) -> None:
    line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), "--cpu", "--nproc", "2", *MODES[mode], DAEMON, *daemon])
    proc = subprocess.run(["bash", "-c", f"{line}; echo after=$?"], env=warm_env, capture_output=True,
                          text=True, timeout=TIMEOUT, start_new_session=True)
    left = daemons(tmp_path)
    kill(left)
    assert "after=0" in proc.stdout, (proc.stdout, proc.stderr)
    assert len(list(tmp_path.glob("daemon*.pid"))) == 2, proc.stderr  # both ranks did make one
    assert left == [], f"{len(left)} daemon(s) outlived the job:\n{proc.stderr}"
    notes = [ln for ln in proc.stderr.splitlines() if " left " in ln and "running" in ln]
    assert len(notes) == 1, proc.stderr
    pids = [(tmp_path / f"daemon{rank}.pid").read_text().split()[0] for rank in (0, 1)]
    if daemon and mode != "exec":  # a forked rank's no-exec daemon carries no mark: found, but not known whose
        assert re.search(rf"a rank left 2 processes running: pid ({pids[0]}|{pids[1]}) ", notes[0]), notes
        assert all(f"pid {pid} " in notes[0] for pid in pids), notes
    else:
        for rank in (0, 1):
            assert re.search(rf"rank {rank} left 1 process running: pid {pids[rank]} ", notes[0]), notes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("daemon", [[], ["--no-exec"]], ids=["exec_daemon", "no_exec_daemon"])
def test_a_daemon_dies_after_the_launcher_is_killed(mode: str, daemon: list[str], tmp_path: Path,
                                                    warm_env: dict[str, str]) -> None:
    """With a relative --log-dir too: the mark the guardian looks for is the run directory's absolute path."""
    proc = subprocess.Popen([*ddpboot_exe(), "--cpu", "--nproc", "2", *MODES[mode], "--log-dir", "logs", DAEMON,
                             *daemon, "--stay"], env=warm_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: len(daemons(tmp_path)) == 2, TIMEOUT, "both ranks' daemons")
        proc.kill()  # SIGKILL: nothing of the launcher runs any more; what it leaves must clean up
        out, err = proc.communicate(timeout=TIMEOUT)
        wait_for(lambda: not daemons(tmp_path), 30, "the daemons the ranks left to be ended")
        assert "Traceback" not in out + err, out + err
    finally:
        kill(daemons(tmp_path))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_daemon_that_cleared_its_environment_is_still_ended_while_the_launcher_lives(tmp_path: Path) -> None:
    """Not marked, but reparented to the launcher: found in its tree (docs say what the guardian cannot find)."""
    line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), "--cpu", "--nproc", "1", DAEMON, "--clear-env"])
    proc = subprocess.run(["bash", "-c", f"{line}; echo after=$?"], env=launch_env(tmp_path), capture_output=True,
                          text=True, timeout=TIMEOUT, start_new_session=True)
    left = daemons(tmp_path)
    kill(left)
    assert "after=0" in proc.stdout, (proc.stdout, proc.stderr)
    assert left == [], proc.stderr
    assert re.search(r"ddpboot: a rank left 1 process running: pid \d+", proc.stderr), proc.stderr
