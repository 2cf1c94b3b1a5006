"""Every wait of the launcher ends at once on Ctrl-C or SIGTERM (130 / 143, nothing started) and, once it has lasted
5 s, says once what it waits for, for how long and how to end it: node 0 waiting for a node that never comes, a node
waiting for a node 0 that was never started, a job waiting for GPUs other jobs hold, an elastic node waiting for its
rendezvous."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support import BEHAVE, SCRIPTS, TIMEOUT, free_port, launch_env, start_launcher, stderr_until, wait_for


def notice(proc: subprocess.Popen[str], timeout: float = 30.0) -> list[str]:
    """The launcher's stderr lines up to its first line naming what it waits for (ending "ends the wait")."""
    lines = stderr_until(proc, lambda got: bool(got) and got[-1].rstrip().endswith("ends the wait"), timeout)
    assert lines and lines[-1].rstrip().endswith("ends the wait"), f"no wait notice within {timeout} s: {lines}"
    return lines


def stop(proc: subprocess.Popen[str], signo: int) -> tuple[int, float, str]:
    """Send `signo`; the exit code, the seconds until the exit, the rest of stderr."""
    sent = time.monotonic()
    proc.send_signal(signo)
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, time.monotonic() - sent, err


def test_waiting_nodes_say_what_they_wait_for_and_end_on_a_stop_signal(tmp_path: Path) -> None:
    node0 = start_launcher(["--cpu", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                            "--nproc", "1", BEHAVE], launch_env(tmp_path / "a"))
    node1 = start_launcher(["--cpu", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                            "--master-port", str(free_port()), "--nproc", "1", BEHAVE], launch_env(tmp_path / "b"))
    lines0, lines1 = notice(node0), notice(node1)
    assert "node 0 of 2 " in lines0[-1] and "for node 1 to join, for up to 600 s" in lines0[-1], lines0
    assert "Ctrl-C (SIGINT) or SIGTERM ends the wait" in lines0[-1]
    assert "node 1 of 2 waiting for node 0's store at 127.0.0.1:" in lines1[-1], lines1
    assert "for up to 600 s" in lines1[-1]
    code0, took0, err0 = stop(node0, signal.SIGTERM)
    code1, took1, err1 = stop(node1, signal.SIGINT)
    assert (code0, code1) == (143, 130), (err0, err1)
    assert "SIGTERM while waiting for the other nodes: nothing was started" in err0
    assert "SIGINT while waiting for the other nodes: nothing was started" in err1
    assert max(took0, took1) < 5, (took0, took1)  # the wait ends within a tick (0.5 s); generous under load
    assert not list(tmp_path.rglob("rank*.json"))  # no rank ran


def test_an_elastic_node_waiting_for_its_round_ends_on_sigint(tmp_path: Path) -> None:
    node = start_launcher(["--cpu", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                           f"127.0.0.1:{free_port()}", "--nproc", "1", BEHAVE], launch_env(tmp_path))
    lines = notice(node)
    assert "waiting for 2 to 3 nodes" in lines[-1] and "for up to 600 s" in lines[-1], lines
    code, took, err = stop(node, signal.SIGINT)
    assert code == 130, err
    assert took < 5, took
    assert not list(tmp_path.rglob("rank*.json"))


def test_a_job_waiting_for_gpus_ends_on_sigint(tmp_path: Path) -> None:
    env = launch_env(tmp_path)
    env["DDPBOOT_FAKE_GPUS"] = "1"
    holder = start_launcher(["--nproc", "1", str(SCRIPTS / "hold_gpus.py"), str(tmp_path), "a"], env)
    waiter = None
    try:
        wait_for(lambda: (tmp_path / "a.0.json").exists(), 60, "the first job to hold the GPU")
        waiter = start_launcher(["--nproc", "1", "--wait-for-gpus", "1h", BEHAVE], env)
        assert waiter.stderr is not None
        line = waiter.stderr.readline()
        assert "waiting for GPUs for up to 3600 s (Ctrl-C (SIGINT) or SIGTERM ends the wait)" in line, line
        code, took, err = stop(waiter, signal.SIGINT)
        assert code == 130 and "SIGINT while waiting for GPUs: nothing was started" in err, err
        assert took < 5, took
    finally:
        (tmp_path / "release").touch()
        holder.communicate(timeout=TIMEOUT)
