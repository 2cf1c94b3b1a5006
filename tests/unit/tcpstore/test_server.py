"""The store server's owner check (ddpboot.tcpstore.server with owner.py), driven step by step over real sockets:
a refused client gets no answer and changes nothing, a client gone before its accept is refused, and other
addresses than loopback are served as before; with an allow-list, an address outside it gets no answer."""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest

from ddpboot.tcpstore.allow import parse_allow_list
from ddpboot.tcpstore.peer import SocketTables
from ddpboot.tcpstore.server import StoreServer
from tests.support import GETNUMKEYS, VALIDATE, set_request, vec

SET_KEY = set_request(b"key", b"value")
OTHER_UID = frozenset({os.getuid() + 1})


class Served:
    """A StoreServer on `host`, pumped by the test (no thread): nothing happens between two `pump` calls."""

    def __init__(self, host: str, **options: object) -> None:
        self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.listener.bind((host, 0))
        self.listener.listen()
        self.warnings: list[str] = []
        self.server = StoreServer(self.listener, self.warnings.append, **options)  # type: ignore[arg-type]
        self.sel = selectors.DefaultSelector()
        self.server.register(self.sel)
        self.address = self.listener.getsockname()[:2]

    def pump(self, until: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "the server did not get there in time"
            self.step(0.01)

    def step(self, wait: float) -> None:
        """One turn of the caller's loop: what is ready, or what the server's timeout was for."""
        timeout = self.server.timeout()
        ready = self.sel.select(wait if timeout is None else min(wait, timeout))
        for key, events in ready or [(None, 0)]:
            self.server.handle(key, events)  # type: ignore[arg-type]

    def close(self) -> None:
        self.server.close()
        self.sel.close()


@pytest.fixture
def served() -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(host: str = "127.0.0.1", **options: object) -> Served:
        made.append(Served(host, **options))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _outcome(sock: socket.socket, served: Served) -> bytes | None:
    """What the client receives, pumping the server meanwhile: the answer's bytes, or None when it is closed."""
    sock.setblocking(False)
    got: list[bytes | None] = []

    def received() -> bool:
        try:
            data = sock.recv(64)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            data = b""
        got.append(data or None)
        return True

    served.pump(received)
    return got[0]


def test_another_uid_gets_no_answer_and_changes_nothing(served: Callable[..., Served]) -> None:
    store = served(allowed_uids=OTHER_UID)
    for _ in range(2):
        with socket.create_connection(store.address) as client:
            client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
            assert _outcome(client, store) is None
    assert store.server.data == {}
    assert len(store.warnings) == 1, store.warnings
    assert store.warnings[0].startswith(f"refused a connection from uid {os.getuid()} ")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_owner_is_served(served: Callable[..., Served], host: str) -> None:
    try:
        store = served(host)
    except OSError:
        pytest.skip(f"no {host} here")
    with socket.create_connection(store.address) as client:
        client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
        assert _outcome(client, store) == struct.pack("=q", 1)
    assert store.warnings == []


def _gone_before_accept(store: Served) -> None:
    """A client that connects, sends a SET and closes, all before the server accepts it; back once the kernel
    has turned its socket into a timewait record (uid 0)."""
    client = socket.create_connection(store.address)
    peer = client.getsockname()[:2]
    client.sendall(VALIDATE + SET_KEY)
    client.close()
    tables = SocketTables()
    deadline = time.monotonic() + 10
    while (entry := tables.find(peer, store.address)) is not None and entry.owner_known:
        assert time.monotonic() < deadline, entry
        time.sleep(0.01)
    tables.close()


def test_a_client_gone_before_its_accept_is_refused_not_taken_for_root(served: Callable[..., Served]) -> None:
    store = served()
    _gone_before_accept(store)
    store.pump(lambda: bool(store.warnings))
    assert store.server.data == {}
    assert "whose it was is unknown" in store.warnings[0]


def test_without_the_check_that_client_writes_its_key(served: Callable[..., Served]) -> None:
    store = served(allowed_uids=None)
    _gone_before_accept(store)
    store.pump(lambda: store.server.data == {b"key": b"value"})
    assert store.warnings == []


def _routable_address() -> str | None:
    """An address of this machine that is not loopback (the one on the default route), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # UDP: no packet is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_other_addresses_are_not_judged_by_uid(served: Callable[..., Served]) -> None:
    address = _routable_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    store = served(address, allowed_uids=OTHER_UID)
    with socket.create_connection(store.address) as client:
        client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
        assert _outcome(client, store) == struct.pack("=q", 1)
    assert store.warnings == []


def _from(source: str, store: Served) -> socket.socket:
    return socket.create_connection(store.address, source_address=(source, 0))


def test_an_address_outside_the_allow_list_gets_no_answer(served: Callable[..., Served]) -> None:
    store = served(allowed_hosts=parse_allow_list("127.0.0.3,10.0.0.0/8"))
    for _ in range(2):
        with _from("127.0.0.2", store) as client:
            client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
            assert _outcome(client, store) is None
    assert store.server.data == {}
    assert store.warnings == [
        "refused a connection from 127.0.0.2: only the job's hosts (--store-allow 127.0.0.3,10.0.0.0/8) may use its "
        "store"
    ]
    with _from("127.0.0.3", store) as client:  # in the list, then judged by uid as every loopback client
        client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
        assert _outcome(client, store) == struct.pack("=q", 1)
    with socket.create_connection(store.address) as client:  # 127.0.0.1: this machine, always let through
        client.sendall(VALIDATE + GETNUMKEYS)
        assert _outcome(client, store) == struct.pack("=q", 1)


def test_a_listed_loopback_address_still_needs_the_owners_uid(served: Callable[..., Served]) -> None:
    store = served(allowed_uids=OTHER_UID, allowed_hosts=parse_allow_list("127.0.0.0/8"))
    with _from("127.0.0.2", store) as client:
        client.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
        assert _outcome(client, store) is None
    assert store.warnings[0].startswith(f"refused a connection from uid {os.getuid()} ")


def test_served_connections_send_small_answers_at_once(served: Callable[..., Served]) -> None:
    store = served(allowed_uids=None)
    with socket.create_connection(store.address) as client:
        client.sendall(VALIDATE + GETNUMKEYS)
        assert _outcome(client, store) == struct.pack("=q", 0)
        (conn,) = store.server.clients.values()
        # no Nagle delay on the store's side (inherited from the listener)
        assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_answers_larger_than_the_socket_buffer_arrive_whole_once_the_client_reads(
    served: Callable[..., Served],
) -> None:
    store = served(allowed_uids=None)
    value = bytes(range(256)) * 4096  # 1 MiB
    gets = 8
    with socket.create_connection(store.address) as client:
        client.sendall(VALIDATE + set_request(b"big", value)
                       + (struct.pack("=B", 3) + vec(b"big")) * gets)
        # the rest waits for room in the socket, and the requests after it for those answers to leave
        store.pump(lambda: any(c.events & select.EPOLLOUT for c in store.server.clients.values()))
        (conn,) = store.server.clients.values()
        expected = vec(value) * gets
        got = bytearray()
        client.setblocking(False)

        def read_some() -> bool:
            with contextlib.suppress(BlockingIOError):
                got.extend(client.recv(1 << 20))
            return len(got) >= len(expected)

        store.pump(read_some)
        assert bytes(got) == expected
        assert conn.events == select.EPOLLIN and not conn.outbuf and not conn.held_back


def test_a_listener_group_is_served_on_every_socket() -> None:
    """Connections queued on each socket of a SO_REUSEPORT group (tcpstore/address.py) are all accepted and
    answered: a socket the server forgot would hold its share of the ranks unanswered."""
    from ddpboot.tcpstore.address import bind_store_socket, listening_sockets

    group = bind_store_socket("127.0.0.1", None, listeners=4)
    assert len(listening_sockets(group)) == 4
    warnings: list[str] = []
    server = StoreServer(group, warnings.append)
    sel = selectors.DefaultSelector()
    server.register(sel)
    clients = [socket.create_connection(group.getsockname()) for _ in range(48)]
    try:
        for n, client in enumerate(clients):
            client.sendall(VALIDATE + set_request(b"key%d" % n, b"v") + GETNUMKEYS)
        deadline = time.monotonic() + 10
        while len(server.data) < len(clients):
            assert time.monotonic() < deadline, f"{len(server.data)} of {len(clients)} keys set"
            for key, events in sel.select(0.01):
                server.handle(key, events)
        for client in clients:
            client.setblocking(True)
            client.settimeout(10)
            assert len(client.recv(8)) == 8
        assert warnings == []
    finally:
        for client in clients:
            client.close()
        server.close()
        sel.close()
    assert all(s.fileno() == -1 for s in listening_sockets(group))


def _answered(sock: socket.socket, store: Served, size: int) -> bytes:
    """`size` bytes of answers on `sock`, pumping the server meanwhile."""
    got = bytearray()
    sock.setblocking(False)

    def read_some() -> bool:
        with contextlib.suppress(BlockingIOError):
            got.extend(sock.recv(1 << 20) or b"")
        return len(got) >= size

    store.pump(read_some)
    return bytes(got)


def test_a_key_declared_larger_than_a_request_may_be_closes_that_client_alone(served: Callable[..., Served]) -> None:
    """A same-uid client declares a key of 2^39 bytes and streams: it is closed as the length arrives, with one
    warning, nothing of it stays buffered, and another client is served meanwhile."""
    store = served()
    with socket.create_connection(store.address) as greedy, socket.create_connection(store.address) as other:
        greedy.sendall(VALIDATE + struct.pack("=BQ", 1, 1 << 39) + b"k" * 65536)
        assert _outcome(greedy, store) is None
        other.sendall(VALIDATE + SET_KEY + GETNUMKEYS)
        assert _answered(other, store, 8) == struct.pack("=q", 1)
    assert store.server.buffered == 0
    assert store.warnings == [f"closing a client connection: a value of {1 << 39} bytes, more than the store takes "
                              "in one request (64 MiB)"]


def test_unfinished_requests_together_stay_within_their_bound(
    served: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MAX_BUFFERED lowered to 1 MiB for the test: two clients' unfinished SETs (600 KiB, then 500 KiB of
    values declared 700 KiB each) would hold more together; the one that holds the most is closed, the other one
    finishes its request and is answered."""
    monkeypatch.setattr("ddpboot.tcpstore.server.MAX_BUFFERED", 1 << 20)
    store = served()
    head = VALIDATE + struct.pack("=B", 1) + vec(b"big") + struct.pack("=Q", 700 << 10)
    with socket.create_connection(store.address) as first, socket.create_connection(store.address) as second:
        first.sendall(head + b"a" * (600 << 10))
        store.pump(lambda: store.server.buffered >= 600 << 10)
        second.sendall(head + b"b" * (500 << 10))
        assert _outcome(first, store) is None
        second.sendall(b"b" * (200 << 10) + GETNUMKEYS)
        assert _answered(second, store, 8) == struct.pack("=q", 1)
    assert store.server.data[b"big"] == b"b" * (700 << 10) and store.server.buffered == 0
    assert len(store.warnings) == 1 and "would hold more than 1 MiB" in store.warnings[0], store.warnings


def test_a_client_that_does_not_read_its_answers_is_not_read_either(served: Callable[..., Served]) -> None:
    """64 GETs of a 256 KiB value sent at once, answers not read: the answers the server holds stay within
    OUT_LIMIT and one answer (the requests wait in the socket); once the client reads, every answer arrives."""
    from ddpboot.tcpstore.server import OUT_LIMIT

    store = served()
    value = b"v" * (256 << 10)
    gets = 64
    with socket.create_connection(store.address) as client:
        client.sendall(VALIDATE + set_request(b"k", value)
                       + (struct.pack("=B", 3) + vec(b"k")) * gets)
        store.pump(lambda: any(c.held_back for c in store.server.clients.values()))
        (conn,) = store.server.clients.values()
        assert len(conn.outbuf) <= OUT_LIMIT + len(value) + 8
        assert not conn.events & select.EPOLLIN
        assert _answered(client, store, gets * (len(value) + 8)) == vec(value) * gets
    assert not conn.held_back


def test_a_wait_of_many_keys_arriving_over_many_reads_is_parsed_once(served: Callable[..., Served]) -> None:
    """A 16 MB WAIT (131,072 keys of 120 bytes, as many as torch's own server takes) sent 64 KiB at a time, the
    server run between the sends: parsed again from its start on each read, as before, it cost the server 10 s of
    CPU (its keys read 128 times over on average); parsed once, 0.3 s. A request of another client between two
    reads is answered at once, and the WAIT is parked on its keys."""
    from ddpboot.tcpstore.protocol import MAX_KEYS

    store = served()
    keys = [b"%0119d/" % n for n in range(MAX_KEYS)]
    request = VALIDATE + struct.pack("=B", 6) + struct.pack("=Q", len(keys)) + b"".join(vec(k) for k in keys)
    assert len(request) > 16_000_000
    with socket.create_connection(store.address) as waiter, socket.create_connection(store.address) as other:
        other.sendall(VALIDATE)
        waiter.setblocking(False)
        cpu = time.process_time()
        for at in range(0, len(request), 1 << 16):
            _send_all(waiter, request[at : at + (1 << 16)], store)
            if at == len(request) // 2:
                other.sendall(GETNUMKEYS)
                assert _answered(other, store, 8) == struct.pack("=q", 0)
        store.pump(lambda: len(store.server.store.waiters) == len(keys))
        cpu = time.process_time() - cpu
    assert cpu < 3, f"{cpu:.1f} s of CPU for one 16 MB WAIT"


def _send_all(sock: socket.socket, data: bytes, store: Served) -> None:
    """Send `data` on a non-blocking socket, running the server whenever the socket's buffer is full."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            store.step(0.01)
    store.step(0)
