"""The launcher's store client (ddpboot.tcpstore.client) against ddpboot's own store server (in a thread) and
torch's TCPStore server; and the nodes' check-in (ddpboot.nodes.check), which talks through that client."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest

from ddpboot.tcpstore.client import StoreClient, StoreGone, StoreTimeout


def listener() -> socket.socket:
    """A listening loopback socket on a free port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_set_get_add_check(store_port: int) -> None:
    with StoreClient("127.0.0.1", store_port) as c:
        c.set("a", b"1")
        assert c.get("a") == b"1"
        assert c.add("n", 2) == 2
        assert c.add("n", 3) == 5
        assert c.get("n") == b"5"
        assert c.check(["a", "n"])
        assert not c.check(["a", "missing"])
        assert c.multi_get(["n", "a", "n"]) == [b"5", b"1", b"5"]  # one request, in the order asked


def test_wait_returns_when_another_client_sets_the_key(store_port: int) -> None:
    with StoreClient("127.0.0.1", store_port) as waiter, StoreClient("127.0.0.1", store_port) as setter:
        done = threading.Event()

        def wait() -> None:
            waiter.wait(["k1", "k2"], timeout=30)
            done.set()

        t = threading.Thread(target=wait)
        t.start()
        setter.set("k1", "x")
        setter.set("k2", "y")
        t.join(30)
        assert done.is_set()


def test_wait_times_out_and_the_connection_stays_usable(store_port: int) -> None:
    with StoreClient("127.0.0.1", store_port) as c:
        with pytest.raises(StoreTimeout):
            c.wait(["never"], timeout=0.2)
        c.set("after", "ok")
        assert c.get("after") == b"ok"


def test_get_of_a_missing_key_times_out(store_port: int) -> None:
    with StoreClient("127.0.0.1", store_port) as c, pytest.raises(StoreTimeout):
        c.get("never", timeout=0.2)


def test_nothing_listening_is_reported_by_the_deadline() -> None:
    sock = listener()
    port = int(sock.getsockname()[1])
    sock.close()
    with pytest.raises(StoreGone, match="cannot connect"):
        StoreClient("127.0.0.1", port, connect_timeout=0.3)


def test_a_closed_server_is_store_gone() -> None:
    sock = listener()
    port = int(sock.getsockname()[1])
    accepted: list[socket.socket] = []

    def accept_then_close() -> None:
        conn, _ = sock.accept()
        conn.recv(64)
        conn.close()
        accepted.append(conn)

    t = threading.Thread(target=accept_then_close)
    t.start()
    with StoreClient("127.0.0.1", port) as c, pytest.raises(StoreGone):
        c.add("x", 1, timeout=10)
    t.join(10)
    sock.close()


def test_speaks_to_torchs_own_server() -> None:
    dist = pytest.importorskip("torch.distributed")
    sock = listener()
    host, port = sock.getsockname()[:2]
    store = dist.TCPStore(host, port, is_master=True, master_listen_fd=sock.fileno(), wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    # torch's client puts "/" before every key; ours sends keys as given.
    with StoreClient("127.0.0.1", port) as c:
        c.set("/from-client", b"hello")
        assert store.get("from-client") == b"hello"
        store.set("from-torch", "world")
        assert c.get("/from-torch") == b"world"
        assert c.add("/count", 4) == 4
        assert store.add("count", 1) == 5
        with pytest.raises(StoreTimeout):
            c.wait(["never"], timeout=0.2)
        assert c.check(["/count"])
        assert c.multi_get(["/from-torch", "/count"]) == [b"world", b"5"]
    del store
