"""The launcher's parts on their own, with real sockets and processes: the store against torch's own client (and
byte by byte), the report on processes that outlive SIGKILL."""

from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from ddpboot.launch.logs import Console, RankStream
from ddpboot.launch.spec import Std
from ddpboot.launch.supervisor.report import report_unkillable
from ddpboot.launch.supervisor.workers import Worker
from ddpboot.selection.planner import RankSlot
from ddpboot.tcpstore.server import StoreServer
from tests.support import GETNUMKEYS, VALIDATE, set_request, vec, wait_for

# --- the store ---------------------------------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[tuple[int, StoreServer]]:
    """A StoreServer on a loopback port, served by a thread of the test process."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    sel = selectors.DefaultSelector()
    server = StoreServer(listener)
    server.register(sel)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for key, events in sel.select(0.05):
                server.handle(key, events)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    yield listener.getsockname()[1], server
    stop.set()
    t.join()
    server.close()


def recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def test_requests_split_at_any_byte_are_answered(store: tuple[int, StoreServer]) -> None:
    port, _ = store
    request = (
        VALIDATE
        + struct.pack("=BI", 13, 77)  # PING 77
        + b"\x01" + vec(b"/k") + vec(b"value")  # SET
        + b"\x04" + vec(b"/n") + struct.pack("=q", 5)  # ADD 5
        + b"\x03" + vec(b"/k")  # GET
    )
    with socket.create_connection(("127.0.0.1", port)) as s:
        for i in range(len(request)):  # one byte at a time: every partial request must wait for the rest
            s.sendall(request[i : i + 1])
        assert recv_exact(s, 4) == struct.pack("=I", 77)
        assert recv_exact(s, 8) == struct.pack("=q", 5)
        assert recv_exact(s, 8 + 5) == vec(b"value")


def test_wait_is_answered_when_another_client_sets_the_key(store: tuple[int, StoreServer]) -> None:
    port, _ = store
    with socket.create_connection(("127.0.0.1", port)) as a, socket.create_connection(("127.0.0.1", port)) as b:
        a.sendall(b"\x06" + struct.pack("=Q", 2) + vec(b"/x") + vec(b"/y"))  # WAIT x, y
        b.sendall(b"\x01" + vec(b"/x") + vec(b"1"))
        b.sendall(b"\x05" + struct.pack("=Q", 1) + vec(b"/x"))  # CHECK x: answered after the SET
        assert recv_exact(b, 1) == b"\x00"
        a.settimeout(0.2)
        with pytest.raises(TimeoutError):
            a.recv(1)  # still waiting for y
        b.sendall(b"\x01" + vec(b"/y") + vec(b"2"))
        a.settimeout(10)
        assert recv_exact(a, 1) == b"\x00"  # STOP_WAITING


def test_cancel_wait_and_unknown_requests(store: tuple[int, StoreServer]) -> None:
    port, server = store
    warnings: list[str] = []
    server.warn = warnings.append
    with socket.create_connection(("127.0.0.1", port)) as a:
        a.sendall(b"\x06" + struct.pack("=Q", 1) + vec(b"/never") + b"\x0c")  # WAIT, then CANCEL_WAIT
        assert recv_exact(a, 1) == b"\x01"  # WAIT_CANCELED
        a.sendall(b"\x07")  # the connection is still in step: GETNUMKEYS
        assert recv_exact(a, 8) == struct.pack("=q", 0)
        a.sendall(b"\xfe")
        a.settimeout(10)
        assert a.recv(1) == b""  # closed
    assert warnings and "--store torch" in warnings[0]


def test_reset_forgets_everything(store: tuple[int, StoreServer]) -> None:
    port, server = store
    with socket.create_connection(("127.0.0.1", port)) as a:
        a.sendall(b"\x01" + vec(b"/k") + vec(b"v") + b"\x07")
        assert recv_exact(a, 8) == struct.pack("=q", 1)
    server.reset()
    assert server.data == {} and server.clients == {}


TORCH_CLIENT = r"""
import datetime, sys, threading, time
import torch.distributed as dist
port = int(sys.argv[1])
c = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
c2 = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
c.set("k", b"v"); assert c.get("k") == b"v"
assert c.add("n", 5) == 5 and c.add("n", -2) == 3 and c.get("n") == b"3"
assert c.compare_set("m", b"", b"x") == b"x"
assert c.compare_set("missing", b"a", b"x") == b"a"
assert c.compare_set("m", b"x", b"y") == b"y" and c.compare_set("m", b"no", b"q") == b"y"
assert c.check(["k"]) and not c.check(["k", "zz"])
try:
    c.wait(["nope"], datetime.timedelta(milliseconds=50)); raise SystemExit("no timeout")
except dist.DistStoreError:
    pass
c.set("after", b"1"); assert c.get("after") == b"1"
assert c.num_keys() == 4
assert c.delete_key("k") and not c.delete_key("k")
c.append("a", b"1"); c.append("a", b"2"); assert c.get("a") == b"12"
c.multi_set(["x", "y"], [b"1", b"22"]); assert c.multi_get(["x", "y"]) == [b"1", b"22"]
assert sorted(c.list_keys()) == ["a", "after", "m", "n", "x", "y"]
c.queue_push("q", b"qq"); assert c.queue_len("q") == 1 and c.queue_pop("q") == b"qq"
try:
    c.queue_pop("q", block=False); raise SystemExit("no QueueEmptyError")
except dist.QueueEmptyError:
    pass
threading.Thread(target=lambda: (time.sleep(0.1), c2.queue_push("q2", b"v"))).start()
assert c.queue_pop("q2") == b"v"
threading.Thread(target=lambda: (time.sleep(0.1), c2.set("late", b"z"))).start()
c.wait(["late"])
big = bytes(range(256)) * 20000; c.set("big", big); assert c.get("big") == big
p = dist.PrefixStore("/worker/attempt_0", c); p.set("x", b"1"); assert c.get("/worker/attempt_0/x") == b"1"
print("ok")
"""


def test_torch_clients_get_what_torchs_own_server_gives(tmp_path: Path) -> None:
    """Every TCPStore client operation of the installed torch, against ddpboot's server (expected answers were
    recorded from torch's own server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    server = subprocess.Popen([sys.executable, "-m", "ddpboot.tcpstore.server", str(listener.fileno())],
                              pass_fds=[listener.fileno()])
    try:
        proc = subprocess.run([sys.executable, "-c", TORCH_CLIENT, str(listener.getsockname()[1])],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    finally:
        server.kill()
        server.wait()
        listener.close()


def _ask(client: socket.socket, request: bytes) -> int:
    """Send `request`, return the 8-byte integer answer."""
    client.sendall(request)
    answer = b""
    while len(answer) < 8:
        chunk = client.recv(8 - len(answer))
        assert chunk, "the store closed the connection"
        answer += chunk
    return int(struct.unpack("=q", answer)[0])


GUARDIAN_ON_A_GROUP = """
import sys
from ddpboot.launch.spec import StoreBackend
from ddpboot.launch.procs.guardian import start_guardian
from ddpboot.tcpstore.address import bind_store_socket, listeners_on
group = bind_store_socket("127.0.0.1", None, listeners=4)
port = group.getsockname()[1]
guardian = start_guardian(group, StoreBackend.PYTHON, None)
group.close()  # as the launcher does: the guardian serves it now
print(port, listeners_on("127.0.0.1", port), flush=True)  # the sockets still listening: the guardian's copies
sys.stdin.read()
guardian.quit()
"""


def test_the_guardian_serves_every_socket_of_a_listener_group() -> None:
    """A launcher whose ranks outnumber one listen queue binds a SO_REUSEPORT group (tcpstore/address.py) and
    closes it once the guardian is forked: the guardian's inherited copies of every socket are served, so no
    share of the connections waits unanswered."""
    proc = subprocess.Popen([sys.executable, "-c", GUARDIAN_ON_A_GROUP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    clients: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port, listeners = (int(f) for f in proc.stdout.readline().split())
        assert listeners == 4
        for n in range(64):  # all four queues get some: (3/4)^64 that one gets none
            client = socket.create_connection(("127.0.0.1", port), timeout=30)
            client.sendall(VALIDATE + set_request(b"k%d" % n, b"v"))
            clients.append(client)
        for client in clients:  # GETNUMKEYS, answered after the SET before it on the same connection
            assert _ask(client, GETNUMKEYS) >= 1
        with socket.create_connection(("127.0.0.1", port), timeout=30) as last:
            assert _ask(last, VALIDATE + GETNUMKEYS) == 64
    finally:
        for client in clients:
            client.close()
        if proc.stdin is not None:
            proc.stdin.close()
        assert proc.wait(timeout=30) == 0


# --- processes that outlive SIGKILL ---------------------------------------------------------------------------


def test_processes_that_outlive_sigkill_are_named(tmp_path: Path) -> None:
    """After SIGKILL the launcher can only wait for a process stuck in the kernel; it says which one and where."""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands in for a stuck rank's group
    err_r, err_w = os.pipe()
    try:
        # on a loaded machine it may not have reached its sleep yet (state running)
        wait_for(lambda: psutil.Process(sleeper.pid).status() == psutil.STATUS_SLEEPING, 30, "sleep to sleep")
        console = Console(err_w, err_w)
        slot = RankSlot(rank=3, local_rank=0, gpus=(), cuda_visible_devices="", device="cpu")
        stream = RankStream(3, Std.OUT, None, None)
        worker = Worker(slot, ["sleep", "60"], {}, tmp_path / "rank3.error.json", stream, stream, pid=sleeper.pid)
        report_unkillable([worker], console)
        worker.group_gone = True
        report_unkillable([worker], console)  # a group known to be gone is not searched
        os.close(err_w)
        with os.fdopen(err_r, "rb") as f:
            err = f.read().decode()
        assert f"rank 3: pid {sleeper.pid} (sleep), state sleeping, in " in err
        assert err.count("still alive") == 1
    finally:
        sleeper.kill()
        sleeper.wait()
