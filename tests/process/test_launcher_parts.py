"""The launcher's parts on their own: the store against torch's own client (and byte by byte), the output
splitter, the signal policy."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.launch.logs import Console, LogFile, RankStream
from ddpboot.launch.options import Std
from ddpboot.launch.procs.signals import REPEAT_WINDOW, ForwardPolicy, SignalInfo
from ddpboot.tcpstore.server import StoreServer

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


def blob(b: bytes) -> bytes:
    return struct.pack("=Q", len(b)) + b


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
        struct.pack("=BI", 0, 0x3C85F7CE)  # VALIDATE
        + struct.pack("=BI", 13, 77)  # PING 77
        + b"\x01" + blob(b"/k") + blob(b"value")  # SET
        + b"\x04" + blob(b"/n") + struct.pack("=q", 5)  # ADD 5
        + b"\x03" + blob(b"/k")  # GET
    )
    with socket.create_connection(("127.0.0.1", port)) as s:
        for i in range(len(request)):  # one byte at a time: every partial request must wait for the rest
            s.sendall(request[i : i + 1])
        assert recv_exact(s, 4) == struct.pack("=I", 77)
        assert recv_exact(s, 8) == struct.pack("=q", 5)
        assert recv_exact(s, 8 + 5) == blob(b"value")


def test_wait_is_answered_when_another_client_sets_the_key(store: tuple[int, StoreServer]) -> None:
    port, _ = store
    with socket.create_connection(("127.0.0.1", port)) as a, socket.create_connection(("127.0.0.1", port)) as b:
        a.sendall(b"\x06" + struct.pack("=Q", 2) + blob(b"/x") + blob(b"/y"))  # WAIT x, y
        b.sendall(b"\x01" + blob(b"/x") + blob(b"1"))
        b.sendall(b"\x05" + struct.pack("=Q", 1) + blob(b"/x"))  # CHECK x: answered after the SET
        assert recv_exact(b, 1) == b"\x00"
        a.settimeout(0.2)
        with pytest.raises(TimeoutError):
            a.recv(1)  # still waiting for y
        b.sendall(b"\x01" + blob(b"/y") + blob(b"2"))
        a.settimeout(10)
        assert recv_exact(a, 1) == b"\x00"  # STOP_WAITING


def test_cancel_wait_and_unknown_requests(store: tuple[int, StoreServer]) -> None:
    port, server = store
    warnings: list[str] = []
    server.warn = warnings.append
    with socket.create_connection(("127.0.0.1", port)) as a:
        a.sendall(b"\x06" + struct.pack("=Q", 1) + blob(b"/never") + b"\x0c")  # WAIT, then CANCEL_WAIT
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
        a.sendall(b"\x01" + blob(b"/k") + blob(b"v") + b"\x07")
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


# --- output ------------------------------------------------------------------------------------------


class Capture:
    """A Console whose stdout/stderr are pipes we can read back."""

    def __init__(self) -> None:
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.console = Console(out_w, err_w)
        self.w = (out_w, err_w)

    def read(self) -> tuple[bytes, bytes]:
        for fd in self.w:
            os.close(fd)
        got = []
        for fd in (self.out_r, self.err_r):
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            os.close(fd)
            got.append(b"".join(chunks))
        return got[0], got[1]


def test_two_ranks_never_share_a_console_line() -> None:
    cap = Capture()
    a = RankStream(0, Std.OUT, cap.console, None)
    b = RankStream(1, Std.OUT, cap.console, None)
    a.feed(b"hel")
    b.feed(b"wor")
    a.feed(b"lo\nsecond")
    b.feed(b"ld\n")
    a.close()
    b.close()
    out, _ = cap.read()
    assert out == b"[rank0]: hello\n[rank1]: world\n[rank0]: second\n"


def test_progress_redraws_are_live_and_keep_their_prefix() -> None:
    cap = Capture()
    bar = RankStream(0, Std.ERR, cap.console, None)
    other = RankStream(1, Std.OUT, cap.console, None)
    bar.feed(b"\r 10%|#")  # tqdm: \r + bar, no terminator
    bar.feed(b"\r 20%|##")
    other.feed(b"note\n")  # ends the bar's line first
    bar.feed(b"\r100%|###\n")
    bar.close()
    other.close()
    out, err = cap.read()
    assert err == b"[rank0]:  10%|#\r[rank0]:  20%|##\n[rank0]: 100%|###\n"
    assert out == b"[rank1]: note\n"
    assert bar.last_lines(5) == ["100%|###"]  # one line of the rank's own, shown as its last redraw


def test_files_get_the_bytes_unchanged(tmp_path: Path) -> None:
    log = LogFile(tmp_path / "rank0.log")
    cap = Capture()
    out = RankStream(0, Std.OUT, cap.console, log, prefix=False)
    err = RankStream(0, Std.ERR, None, log)
    out.feed(b"a\r\nb")
    err.feed(b"E1\n")
    out.feed(b"c\n\xff partial")
    out.close()
    err.close()
    log.close()
    assert (tmp_path / "rank0.log").read_bytes() == b"a\r\nE1\nbc\n\xff partial"
    console_out, console_err = cap.read()
    assert console_out == b"a\r\nbc\n\xff partial\n" and console_err == b""


# --- signals -----------------------------------------------------------------------------------------


HANDLED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})


def test_policy_forwards_once_and_trusts_slurm() -> None:
    p = ForwardPolicy(HANDLED)
    usr1 = SignalInfo(signal.SIGUSR1, 0, 4242)
    d = p.decide(usr1, 100.0, "bash")
    assert d.forward and not d.stop
    assert not p.decide(usr1, 100.0 + REPEAT_WINDOW / 2, "bash").forward  # a burst: once
    assert p.decide(usr1, 100.0 + REPEAT_WINDOW * 2, "bash").forward  # later: again
    d = p.decide(usr1, 200.0, "slurmstepd")
    assert not d.forward and "slurmstepd" in d.why
    d = p.decide(usr1, 300.0, "python", from_worker=True)
    assert not d.forward and not d.terminate_workers


def test_policy_stops_on_terminating_signals_and_kills_on_a_second_sigint() -> None:
    p = ForwardPolicy(HANDLED)
    d = p.decide(SignalInfo(signal.SIGINT, 0x80, 0), 1.0)
    assert d.forward and d.stop and not d.kill
    d = p.decide(SignalInfo(signal.SIGINT, 0x80, 0), 1.1)
    assert d.kill
    p = ForwardPolicy(HANDLED)
    d = p.decide(SignalInfo(signal.SIGTERM, 0, 7), 1.0, "slurmstepd")
    assert d.stop and not d.forward and not d.terminate_workers  # SLURM delivered it to the workers
    p = ForwardPolicy(HANDLED)
    d = p.decide(SignalInfo(signal.SIGTERM, 0, 7), 1.0, "python", from_worker=True)
    assert d.stop and not d.forward and d.terminate_workers  # nobody else will tell the other workers


def test_processes_that_outlive_sigkill_are_named() -> None:
    """After SIGKILL the launcher can only wait for a process stuck in the kernel; it says which one and where."""
    from types import SimpleNamespace

    from ddpboot.launch.supervisor import Supervisor

    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands in for a stuck rank's group
    try:
        cap = Capture()
        sup = Supervisor.__new__(Supervisor)
        sup.workers = [SimpleNamespace(pid=sleeper.pid, group_gone=False, slot=SimpleNamespace(rank=3))]  # type: ignore[list-item]
        sup.console = cap.console
        sup._report_unkillable()
        _, err = cap.read()
        assert f"rank 3: pid {sleeper.pid} (sleep), state sleeping, in " in err.decode()
    finally:
        sleeper.kill()
        sleeper.wait()
