"""Only the job's owner reaches its store: a real `ddpboot --nproc 2 --cpu` job, a client of another uid (65534,
as root only) refused before any answer and reported once, and a client of the job's own uid served; uid 65534
flooding the store with thousands of connections as it starts, under the job's real open-file limits, gets no
answer and the job runs; a machine whose socket tables cannot be read (a real mount namespace and seccomp filter)
refuses the job before it starts; a two-node job with `--store-allow` refuses a client whose address is outside
the list (docs/security.md)."""

from __future__ import annotations

import ctypes
import encodings.idna  # noqa: F401  (the child that drops to uid 65534 can no longer read the interpreter's files)
import errno
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpboot.tcpstore.client import StoreClient
from tests.support import (
    GETNUMKEYS,
    SCRIPTS,
    VALIDATE,
    as_uid,
    ddpboot_exe,
    finish,
    free_port,
    launch_env,
    reports,
    set_request,
    start_launcher,
    talk,
    wait_for,
)

JOB = str(SCRIPTS / "store_owner_job.py")
FLOOD = SCRIPTS / "store_flood.py"
NOBODY = 65534
INTRUDER_KEYS = ("intruder", "hit-and-run")
FLOOD_CONNECTIONS = 4300  # more than the job's whole open-file table at 4096, and than the listen queue holds
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test drops a child to uid 65534 (CI runs "
                               "as root)")
INTRUDER = VALIDATE + set_request(b"intruder", b"x") + GETNUMKEYS  # a SET, then GETNUMKEYS (answered with 8 bytes)


def _hit_and_run(port: int) -> str:
    """A SET sent and the socket closed at once, maybe before the store accepts it (the kernel then reports the
    closed socket as uid 0's)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(VALIDATE + set_request(b"hit-and-run", b"x"))
    return "sent"


def _as_uid(uid: int, port: int) -> list[str]:
    """Three refused clients and one hit-and-run from a forked child that dropped to `uid`; their outcomes."""
    return as_uid(uid, lambda: [talk(port, INTRUDER) for _ in range(3)] + [_hit_and_run(port)])


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


@ROOT_ONLY
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
        outcomes = [talk(port, INTRUDER, "127.0.0.2") for _ in range(2)]
        served = talk(port, INTRUDER)
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


def _open_files(limit: int) -> Callable[[], None]:
    """A preexec_fn: the child's soft and hard RLIMIT_NOFILE set to `limit`."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _strangers_python() -> str | None:
    """A Python interpreter that uid 65534 may run (this test's own may live in a directory only root can read)."""
    for python in dict.fromkeys([os.path.realpath(p) for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                                 if os.path.exists(p)]):
        probe = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", python,
                                "-c", "pass"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return python
    return None


@ROOT_ONLY
@pytest.mark.parametrize("limit", [1024, 4096, None], ids=["nofile-1024", "nofile-4096", "default-limits"])
def test_a_flood_by_another_uid_as_the_store_starts_gets_no_answer(tmp_path: Path, limit: int | None) -> None:
    """uid 65534 opens 4,300 connections as soon as the store listens and sends VALIDATE, a SET and GETNUMKEYS on
    each, then watches them for up to 60 s: not one is answered, each is closed by the store, the SET changed
    nothing, and the job, with its hard open-file limit at 1024, 4096 or as the machine has it, starts and exits 0
    in seconds (it used to wait for the stranger to let go: its connections, admitted, filled the table)."""
    python = _strangers_python()
    if python is None or shutil.which("setpriv") is None:
        pytest.skip("no setpriv, or no Python interpreter that uid 65534 may run")
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    go.touch()  # the ranks do not wait: the job joins, checks the key, and exits
    port = free_port()
    env = launch_env(out, tmp_path, STORE_OWNER_GO=str(go), STORE_OWNER_KEYS="intruder")
    flood = subprocess.Popen(
        ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", python, "-c",
         FLOOD.read_text(), str(port), str(FLOOD_CONNECTIONS), "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_open_files(FLOOD_CONNECTIONS + 100),
    )
    started = time.monotonic()
    job = subprocess.run([*ddpboot_exe(), "--nproc", "2", "--cpu", "--master-port", str(port), JOB], env=env,
                         capture_output=True, text=True, timeout=180,
                         preexec_fn=_open_files(limit) if limit else None)
    took = time.monotonic() - started
    seen, flood_err = flood.communicate(timeout=120)
    assert flood.returncode == 0, flood_err
    result = json.loads(seen)
    assert result["connected"] >= FLOOD_CONNECTIONS - 100, result
    assert result["answered"] == 0 and result["open"] == 0, result
    assert job.returncode == 0, job.stderr[-3000:]
    assert took < 30, f"the job took {took:.1f} s under the flood"
    assert json.loads((out / "keys.json").read_text()) == {"intruder": False}
    refused = [line for line in job.stderr.splitlines() if line.startswith("ddpboot: store: refused")]
    assert any(f"from uid {NOBODY} (nobody" in line for line in refused), job.stderr[-3000:]
    assert "serving every local connection" not in job.stderr


# A seccomp filter (x86-64) that fails socket(AF_NETLINK, *, NETLINK_SOCK_DIAG) with EPERM and allows the rest.
_BPF_LD_ABS, _BPF_JEQ, _BPF_RET = 0x20, 0x15, 0x06
_NO_SOCK_DIAG = [
    (_BPF_LD_ABS, 0, 0, 4), (_BPF_JEQ, 0, 6, 0xC000003E),  # arch: x86-64, else allow
    (_BPF_LD_ABS, 0, 0, 0), (_BPF_JEQ, 0, 4, 41),  # syscall: socket
    (_BPF_LD_ABS, 0, 0, 16), (_BPF_JEQ, 0, 2, socket.AF_NETLINK),  # its family
    (_BPF_LD_ABS, 0, 0, 32), (_BPF_JEQ, 1, 0, 4),  # its protocol: NETLINK_SOCK_DIAG
    (_BPF_RET, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    (_BPF_RET, 0, 0, 0x00050000 | errno.EPERM),  # SECCOMP_RET_ERRNO
]


def _without_sock_diag() -> None:
    """A preexec_fn: install _NO_SOCK_DIAG (kept across exec, by every process the child starts)."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(_NO_SOCK_DIAG))(*[Filter(*f) for f in _NO_SOCK_DIAG])
    program = Program(len(_NO_SOCK_DIAG), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(program), 0, 0):  # NO_NEW_PRIVS, SET_SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp")


@ROOT_ONLY
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the seccomp filter is written for x86-64")
def test_where_no_socket_table_can_be_read_the_job_is_refused_before_it_starts(tmp_path: Path) -> None:
    """A real sandbox without the kernel's socket tables: a mount namespace whose /proc shows processes only
    (proc's subset=pid: no /proc/net) and a seccomp filter that refuses sock_diag netlink sockets. The store
    could not tell the owner's connections from anyone's: one error, exit 2, no rank started."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "go").touch()  # a job that started would not wait
    command = [*ddpboot_exe(), "--nproc", "2", "--cpu", JOB]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
         'mount -t proc -o subset=pid proc /proc || exit 99; exec "$@"', "sh", *command],
        env=launch_env(out, tmp_path, STORE_OWNER_GO=str(tmp_path / "go")), capture_output=True, text=True,
        timeout=120, preexec_fn=_without_sock_diag,
    )
    if done.returncode == 99:
        pytest.skip(f"cannot mount a proc of processes only here: {done.stderr.strip()}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("ddpboot: error: the job's store on 127.0.0.1 cannot tell which user a local "
                               "connection comes from here (cannot read /proc/net/tcp or tcp6"), lines[0]
    assert "--store torch" in lines[0]
    assert not list(out.glob("rank*.json"))
