"""The store's limits, against a real `ddpboot --nproc 2 --cpu` job and clients of the job's own uid: a client that
declares a 2^39-byte key and streams is closed as the length arrives and the guardian's memory does not grow; with
the job's hard open-file limit at 1024 and 1,100 idle connections, the guardian does not spin (its CPU time, read
from /proc) and a new client is answered once connections close (docs/security.md)."""

from __future__ import annotations

import json
import resource
import socket
import struct
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support import GETNUMKEYS, SCRIPTS, VALIDATE, ddpboot_exe, finish, launch_env, reports, wait_for

JOB = str(SCRIPTS / "store_owner_job.py")
IDLE = 1100


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


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


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


def test_a_full_open_file_table_does_not_spin_and_a_new_client_is_served_once_one_closes(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < IDLE + 200:
        pytest.skip(f"this test holds {IDLE} connections itself: its hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc, go, port, guardian = _start(tmp_path, nofile=1024)
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            idle[-1].sendall(VALIDATE)
        wait_for(lambda: guardian.num_fds() >= 1024 - 16, 30, "the guardian to fill its table")
        cpu, started = _cpu(guardian), time.monotonic()
        late = socket.create_connection(("127.0.0.1", port), timeout=30)  # waits in the listen queue
        late.sendall(VALIDATE + GETNUMKEYS)
        wait_for(lambda: time.monotonic() - started >= 3, 10, "3 s of a full table", interval=0.1)
        spent = _cpu(guardian) - cpu
        for sock in idle[:200]:
            sock.close()
        answer = late.recv(8)
        late.close()
    finally:
        for sock in idle:
            sock.close()
        err = _end(proc, go)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert spent < 0.3, f"the guardian spent {spent:.2f} s of CPU in 3 s of a full table"
    assert len(answer) == 8 and struct.unpack("=q", answer)[0] >= 0
    full = [line for line in err.splitlines() if "open-file table is full" in line]
    assert len(full) == 1 and "of the 1024 that ulimit -n allows" in full[0], err[-3000:]
    assert json.loads((tmp_path / "out" / "keys.json").read_text()) == {}
