"""Only the job's owner reaches its store: a real `ddpboot --nproc 2 --cpu` job, a client of another uid (65534,
as root only) refused before any answer and reported once, and a client of the job's own uid served; a two-node
job with `--store-allow` refuses a client whose address is outside the list (docs/security.md)."""

from __future__ import annotations

import encodings.idna  # noqa: F401  (the child that drops to uid 65534 can no longer read the interpreter's files)
import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from ddpboot.tcpstore.client import StoreClient
from tests.support import SCRIPTS, as_uid, finish, free_port, launch_env, reports, start_launcher, wait_for

JOB = str(SCRIPTS / "store_owner_job.py")
NOBODY = 65534
INTRUDER_KEYS = ("intruder", "hit-and-run")


def _vec(data: bytes) -> bytes:
    return struct.pack("=Q", len(data)) + data


# torch's TCPStore protocol: VALIDATE with its magic number, SET key value, GETNUMKEYS (answered with 8 bytes).
_VALIDATE = struct.pack("=BI", 0, 0x3C85F7CE)
_SET_INTRUDER = struct.pack("=B", 1) + _vec(b"intruder") + _vec(b"x")
_SET_HIT_AND_RUN = struct.pack("=B", 1) + _vec(b"hit-and-run") + _vec(b"x")
_GETNUMKEYS = struct.pack("=B", 7)


def _talk(port: int, source: str | None = None) -> str:
    """Connect (from address `source` when given), send requests, and say what came back: `closed` (end of stream
    or reset) or the answer's bytes."""
    bind = (source, 0) if source else None
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=bind) as sock:
        try:
            sock.sendall(_VALIDATE + _SET_INTRUDER + _GETNUMKEYS)
            answer = sock.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        return "closed" if not answer else f"answered {answer!r}"


def _hit_and_run(port: int) -> str:
    """A SET sent and the socket closed at once, maybe before the store accepts it (the kernel then reports the
    closed socket as uid 0's)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(_VALIDATE + _SET_HIT_AND_RUN)
    return "sent"


def _as_uid(uid: int, port: int) -> list[str]:
    """Three refused clients and one hit-and-run from a forked child that dropped to `uid`; their outcomes."""
    return as_uid(uid, lambda: [_talk(port) for _ in range(3)] + [_hit_and_run(port)])


def _start_job(tmp_path: Path, keys: str) -> tuple[Any, Path, dict[int, dict[str, Any]]]:
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    env = launch_env(out, tmp_path, STORE_OWNER_GO=str(go), STORE_OWNER_KEYS=keys)
    proc = start_launcher(["--nproc", "2", "--cpu", JOB], env)
    try:
        ranks = wait_for(lambda: r if len(r := reports(out)) == 2 else None, 120, "both ranks to report")
    except Exception:
        go.touch()
        rc, _, err = finish(proc)
        raise AssertionError(f"the job did not start (rc {rc}):\n{err[-3000:]}") from None
    return proc, go, ranks


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test drops a child to uid 65534 (CI runs as root)")
def test_another_uid_is_closed_before_any_answer(tmp_path: Path) -> None:
    proc, go, ranks = _start_job(tmp_path, ",".join(INTRUDER_KEYS))
    try:
        outcomes = _as_uid(NOBODY, ranks[0]["master_port"])
    finally:
        go.touch()
    rc, _, err = finish(proc)
    assert outcomes == ["closed", "closed", "closed", "sent"], outcomes
    assert rc == 0, err[-3000:]
    assert json.loads((tmp_path / "out" / "keys.json").read_text()) == dict.fromkeys(INTRUDER_KEYS, False)
    refusals = [line for line in err.splitlines() if "refused a connection" in line]
    by_nobody = [line for line in refusals if f"from uid {NOBODY} " in line]
    assert len(by_nobody) == 1, err[-3000:]
    assert by_nobody[0].startswith(f"ddpboot: store: refused a connection from uid {NOBODY} (nobody"), by_nobody
    assert "only the job's owner (uid 0) may use its store" in by_nobody[0]
    # The hit-and-run client may have closed before it was accepted: refused as unknown, never as anyone's.
    others = [line for line in refusals if line not in by_nobody]
    assert all("whose it was is unknown" in line for line in others), err[-3000:]


def test_the_owners_own_connection_is_served(tmp_path: Path) -> None:
    proc, go, ranks = _start_job(tmp_path, "visitor")
    try:
        with StoreClient("127.0.0.1", ranks[0]["master_port"], connect_timeout=20) as client:
            client.set("visitor", "here")
            assert client.get("visitor", timeout=20) == b"here"
    finally:
        go.touch()
    rc, _, err = finish(proc)
    assert rc == 0, err[-3000:]
    assert "refused" not in err, err[-3000:]
    assert json.loads((tmp_path / "out" / "keys.json").read_text()) == {"visitor": True}
    assert {r["uid"] for r in ranks.values()} == {os.getuid()}


def test_an_address_outside_the_allow_list_is_closed_before_any_answer(tmp_path: Path) -> None:
    """Two node launchers on this machine (node 1's rank connects from 127.0.0.1, which is this machine and goes
    through the uid rule); 127.0.0.2 stands for a host outside `--store-allow`: loopback addresses other than
    127.0.0.1 are judged by the list like any other (ddpboot/tcpstore/allow.py)."""
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    env = launch_env(out, tmp_path, STORE_OWNER_GO=str(go), STORE_OWNER_KEYS="intruder")
    port = free_port()
    procs = [start_launcher(["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), "--nproc", "1", "--cpu", "--store-allow", "127.0.0.3",
                             JOB], env) for rank in (0, 1)]
    try:
        wait_for(lambda: len(reports(out)) == 2 or None, 180, "both ranks to report")
        outcomes = [_talk(port, "127.0.0.2") for _ in range(2)]
        served = _talk(port)
    finally:
        go.touch()
        (rc0, _, err0), (rc1, _, err1) = (finish(p) for p in procs)
    assert outcomes == ["closed", "closed"], outcomes
    assert served.startswith("answered"), served  # 127.0.0.1, the job owner's uid
    assert (rc0, rc1) == (0, 0), err0[-3000:] + err1[-3000:]
    assert json.loads((out / "keys.json").read_text()) == {"intruder": True}  # only the served client's SET
    refusals = [line for line in err0.splitlines() if "refused a connection" in line]
    assert refusals == ["ddpboot: store: refused a connection from 127.0.0.2: only the job's hosts (--store-allow "
                        "127.0.0.3) may use its store"], err0[-3000:]
