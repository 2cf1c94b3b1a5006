"""The launcher's store client (ddpboot.tcpstore.client) against ddpboot's own store server (in a thread) and
torch's TCPStore server; and the nodes' check-in (ddpboot.nodes.check), which talks through that client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

from ddpboot.tcpstore.client import StoreClient, StoreGone, StoreTimeout
from ddpboot.tcpstore.server import serve_forever


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@pytest.fixture
def server() -> Iterator[int]:
    """ddpboot's store server on a loopback port, in a daemon thread (it serves until the test process ends)."""
    sock = _listener()
    threading.Thread(target=serve_forever, args=(sock,), daemon=True).start()
    yield int(sock.getsockname()[1])


def test_set_get_add_check(server: int) -> None:
    with StoreClient("127.0.0.1", server) as c:
        c.set("a", b"1")
        assert c.get("a") == b"1"
        assert c.add("n", 2) == 2
        assert c.add("n", 3) == 5
        assert c.get("n") == b"5"
        assert c.check(["a", "n"])
        assert not c.check(["a", "missing"])


def test_wait_returns_when_another_client_sets_the_key(server: int) -> None:
    with StoreClient("127.0.0.1", server) as waiter, StoreClient("127.0.0.1", server) as setter:
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


def test_wait_times_out_and_the_connection_stays_usable(server: int) -> None:
    with StoreClient("127.0.0.1", server) as c:
        with pytest.raises(StoreTimeout):
            c.wait(["never"], timeout=0.2)
        c.set("after", "ok")
        assert c.get("after") == b"ok"


def test_get_of_a_missing_key_times_out(server: int) -> None:
    with StoreClient("127.0.0.1", server) as c, pytest.raises(StoreTimeout):
        c.get("never", timeout=0.2)


def test_nothing_listening_is_reported_by_the_deadline() -> None:
    sock = _listener()
    port = int(sock.getsockname()[1])
    sock.close()
    with pytest.raises(StoreGone, match="cannot connect"):
        StoreClient("127.0.0.1", port, connect_timeout=0.3)


def test_a_closed_server_is_store_gone() -> None:
    sock = _listener()
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
    sock = _listener()
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
    del store


# --- the nodes' check-in (ddpboot.nodes.check) -----------------------------------------------


def _check_all(port: int, sizes: list[int], ranks: list[int] | None = None, timeout: float = 30) -> list[str]:
    """Run check_nodes for every node in threads; each node's outcome: "ok" or its error message."""
    from ddpboot.errors import UsageError
    from ddpboot.nodes.check import check_nodes

    ranks = ranks if ranks is not None else list(range(len(sizes)))
    out = [""] * len(sizes)

    def node(i: int) -> None:
        try:
            check_nodes("127.0.0.1", port, len(sizes), ranks[i], sizes[i], timeout=timeout, host=f"h{i}")
            out[i] = "ok"
        except UsageError as exc:
            out[i] = str(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_nodes_that_agree_pass(server: int) -> None:
    assert _check_all(server, [2, 2, 2]) == ["ok", "ok", "ok"]


def test_mismatched_rank_counts_are_reported_on_every_node(server: int) -> None:
    out = _check_all(server, [2, 1])
    for msg in out:
        assert "node 0 (h0): 2, node 1 (h1): 1" in msg and "same --nproc" in msg


def test_a_node_that_never_comes_is_reported_by_the_deadline(server: int) -> None:
    from ddpboot.errors import UsageError
    from ddpboot.nodes.check import check_nodes

    with pytest.raises(UsageError, match=r"node 1 of 2 did not join .* within 0.3 s"):
        check_nodes("127.0.0.1", server, 2, 0, 2, timeout=0.3)


def test_two_launchers_claiming_one_node_rank_are_reported(server: int) -> None:
    out = _check_all(server, [2, 2, 2], ranks=[0, 1, 1], timeout=1)
    assert any("two launchers claimed node rank 1" in msg for msg in out), out
    assert "ok" not in out[1:]
