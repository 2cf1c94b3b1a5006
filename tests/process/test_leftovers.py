"""Nothing a rank starts outlives the job: a daemon made by the classic double fork (`fork(); setsid(); fork()`),
which leaves the rank's process group and session, is ended when the job ends (the launcher is a child subreaper:
the daemon is reparented to it), and after a SIGKILL of the launcher (the guardian finds it by the job's mark in
its environment). The launcher says once which rank left which process. Each test counts the daemons still alive.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import psutil

from tests.support import SCRIPTS, TIMEOUT, ddpboot_exe, launch_env, wait_for

DAEMON = str(SCRIPTS / "leave_daemon.py")


def daemons(out: Path) -> list[psutil.Process]:
    """The daemons the job's ranks wrote down that are still alive (a pid reused since is not one: its command
    line must still be the daemon's)."""
    alive = []
    for path in out.glob("daemon*.pid"):
        try:
            proc = psutil.Process(int(path.read_text()))
            if "leftover-daemon" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return alive


def kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def test_a_double_forked_daemon_ends_with_the_job(tmp_path: Path) -> None:
    line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), "--cpu", "--nproc", "2", DAEMON])
    proc = subprocess.run(["bash", "-c", f"{line}; echo after=$?"], env=launch_env(tmp_path), capture_output=True,
                          text=True, timeout=TIMEOUT, start_new_session=True)
    left = daemons(tmp_path)
    kill(left)
    assert "after=0" in proc.stdout, (proc.stdout, proc.stderr)
    assert len(list(tmp_path.glob("daemon*.pid"))) == 2, proc.stderr  # both ranks did make one
    assert left == [], f"{len(left)} daemon(s) outlived the job:\n{proc.stderr}"
    notes = [ln for ln in proc.stderr.splitlines() if "left 1 process running" in ln]
    assert len(notes) == 1, proc.stderr
    for rank in (0, 1):
        pid = (tmp_path / f"daemon{rank}.pid").read_text()
        assert re.search(rf"rank {rank} left 1 process running: pid {pid} \(.*leftover-daemon\)", notes[0]), notes


def test_a_daemon_dies_after_the_launcher_is_killed(tmp_path: Path) -> None:
    """With a relative --log-dir too: the mark the guardian looks for is the run directory's absolute path."""
    proc = subprocess.Popen([*ddpboot_exe(), "--cpu", "--nproc", "2", "--log-dir", "logs", DAEMON, "--stay"],
                            env=launch_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        wait_for(lambda: len(daemons(tmp_path)) == 2, TIMEOUT, "both ranks' daemons")
        proc.kill()  # SIGKILL: nothing of the launcher runs any more; its guardian must clean up
        proc.communicate(timeout=TIMEOUT)
        wait_for(lambda: not daemons(tmp_path), 30, "the guardian to end the daemons the ranks left")
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
