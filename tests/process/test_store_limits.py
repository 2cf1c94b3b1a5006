"""The store's limits, against a real `ddpboot --nproc 2 --cpu` job and clients of the job's own uid: a client that
declares a 2^39-byte key and streams is closed as the length arrives and the guardian's memory does not grow
(docs/security.md)."""

from __future__ import annotations

import resource
import socket
import struct
import subprocess
from pathlib import Path

import psutil

from tests.support import SCRIPTS, ddpboot_exe, finish, launch_env, reports, wait_for

JOB = str(SCRIPTS / "store_owner_job.py")
VALIDATE = struct.pack("=BI", 0, 0x3C85F7CE)
GETNUMKEYS = struct.pack("=B", 7)


def _start(tmp_path: Path, nofile: int | None = None) -> tuple[subprocess.Popen[str], Path, int, psutil.Process]:
    """The job, its `go` file, its store's port and its guardian (the process named ddpboot-guard)."""
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    env = launch_env(out, tmp_path, STORE_OWNER_GO=str(go), STORE_OWNER_KEYS="")
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
    proc = subprocess.Popen([*ddpboot_exe(), "--nproc", "2", "--cpu", JOB], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=limit)
    try:
        ranks = wait_for(lambda: r if len(r := reports(out)) == 2 else None, 120, "both ranks to report")
        guardian = next(p for p in psutil.Process(proc.pid).children() if p.name() == "ddpboot-guard")
    except Exception:
        go.touch()
        rc, _, err = finish(proc)
        raise AssertionError(f"the job did not start (rc {rc}):\n{err[-3000:]}") from None
    return proc, go, int(ranks[0]["master_port"]), guardian


def _end(proc: subprocess.Popen[str], go: Path) -> str:
    go.touch()
    rc, _, err = finish(proc)
    assert rc == 0, err[-3000:]
    return str(err)


def test_a_key_declared_at_2_to_the_39_bytes_is_refused_and_the_guardian_stays_small(tmp_path: Path) -> None:
    proc, go, port, guardian = _start(tmp_path)
    try:
        before = guardian.memory_info().rss
        streamed = 0
        with socket.create_connection(("127.0.0.1", port), timeout=30) as greedy:
            greedy.sendall(VALIDATE + struct.pack("=BQ", 1, 1 << 39))
            chunk = b"k" * (1 << 20)
            try:
                while streamed < 1 << 30:  # 1 GiB at most: the store closes it long before
                    greedy.sendall(chunk)
                    streamed += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
        grown = guardian.memory_info().rss - before
        with socket.create_connection(("127.0.0.1", port), timeout=30) as other:
            other.sendall(VALIDATE + GETNUMKEYS)
            answer = other.recv(8)
    finally:
        err = _end(proc, go)
    assert streamed < 1 << 30, "the store took 1 GiB of a request declared 2^39 bytes"
    assert grown < 16 << 20, f"the guardian grew by {grown >> 20} MiB"
    assert len(answer) == 8
    closing = [line for line in err.splitlines() if "closing a client connection" in line]
    assert closing == [f"ddpboot: store: closing a client connection: a value of {1 << 39} bytes, more than the "
                       "store takes in one request (64 MiB)"], err[-3000:]
