"""What each TCPStore request does to the store and answers (ddpboot.tcpstore.commands), without sockets: requests
are encoded as torch's client sends them and run against KeyValues; answers are read from the connection's
output buffer."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from ddpboot.tcpstore import protocol as p
from ddpboot.tcpstore.commands import COMMANDS, SHAPES, Connection, KeyValues
from ddpboot.tcpstore.protocol import Framer, NeedMore, ProtocolError, Reader, vec, vecs


@pytest.fixture
def conns() -> Iterator[tuple[Connection, Connection]]:
    a, b = socket.socketpair()
    try:
        yield Connection(a), Connection(b)
    finally:
        a.close()
        b.close()


class Store:
    """KeyValues and the connections it woke (their parked WAIT answered)."""

    def __init__(self) -> None:
        self.woken: list[Connection] = []
        self.kv = KeyValues(wake=self.woken.append)

    def run(self, conn: Connection, request: bytes) -> bytes:
        """Run one request of `conn`; what it answered."""
        reader = Reader(bytearray(request))
        self.kv.execute(reader.u8(), conn, reader)
        assert reader.pos == len(request), "the handler did not read its whole request"
        answer = bytes(conn.outbuf)
        conn.outbuf.clear()
        return answer


def req(code: int, *fields: bytes) -> bytes:
    return bytes([code]) + b"".join(fields)


def i64(n: int) -> bytes:
    return struct.pack("=q", n)


def test_set_get_add_and_the_key_count(conns: tuple[Connection, Connection]) -> None:
    c, _ = conns
    s = Store()
    assert s.run(c, req(p.VALIDATE, struct.pack("=I", p.VALIDATION_MAGIC))) == b""
    assert s.run(c, req(p.PING, struct.pack("=I", 9))) == struct.pack("=I", 9)
    assert s.run(c, req(p.SET, vec(b"k"), vec(b"v"))) == b""
    assert s.run(c, req(p.GET, vec(b"k"))) == vec(b"v")
    assert s.run(c, req(p.ADD, vec(b"n"), i64(5))) == i64(5)
    assert s.run(c, req(p.ADD, vec(b"n"), i64(-2))) == i64(3)
    assert s.run(c, req(p.APPEND, vec(b"k"), vec(b"w"))) == b""
    assert s.run(c, req(p.MULTI_GET, vecs([b"k", b"n"]))) == vec(b"vw") + vec(b"3")
    assert s.run(c, req(p.GETNUMKEYS)) == i64(2)
    assert s.run(c, req(p.LIST_KEYS)) == i64(2) + vec(b"k") + vec(b"n")
    assert s.run(c, req(p.DELETE_KEY, vec(b"k"))) == i64(1)
    assert s.run(c, req(p.DELETE_KEY, vec(b"k"))) == i64(0)
    assert s.run(c, req(p.MULTI_SET, struct.pack("=Q", 2), vec(b"x"), vec(b"1"), vec(b"y"), vec(b"2"))) == b""
    assert s.kv.data == {b"n": b"3", b"x": b"1", b"y": b"2"}


def test_compare_set_answers_as_torchs_server(conns: tuple[Connection, Connection]) -> None:
    c, _ = conns
    s = Store()
    assert s.run(c, req(p.COMPARE_SET, vec(b"m"), vec(b""), vec(b"x"))) == vec(b"x")  # missing, expected empty: set
    assert s.run(c, req(p.COMPARE_SET, vec(b"gone"), vec(b"a"), vec(b"x"))) == vec(b"a")  # missing: `expected` back
    assert s.run(c, req(p.COMPARE_SET, vec(b"m"), vec(b"x"), vec(b"y"))) == vec(b"y")  # matches: swapped
    assert s.run(c, req(p.COMPARE_SET, vec(b"m"), vec(b"no"), vec(b"q"))) == vec(b"y")  # differs: current value
    assert b"gone" not in s.kv.data


def test_queues(conns: tuple[Connection, Connection]) -> None:
    c, _ = conns
    s = Store()
    assert s.run(c, req(p.QUEUE_PUSH, vec(b"q"), vec(b"a"))) == b""
    assert s.run(c, req(p.QUEUE_LEN, vec(b"q"))) == i64(1)
    assert s.run(c, req(p.CHECK, vecs([b"q"]))) == bytes([p.READY])
    assert s.run(c, req(p.QUEUE_POP, vec(b"q"))) == i64(1) + vec(b"a")
    assert s.run(c, req(p.QUEUE_POP, vec(b"q"))) == i64(0)
    assert s.run(c, req(p.CHECK, vecs([b"q"]))) == bytes([p.NOT_READY])


def test_a_wait_is_parked_until_its_last_key_exists(conns: tuple[Connection, Connection]) -> None:
    waiter, setter = conns
    s = Store()
    assert s.run(waiter, req(p.WAIT, vecs([b"x", b"y"]))) == b""
    s.run(setter, req(p.SET, vec(b"x"), vec(b"1")))
    assert s.woken == [] and waiter.outbuf == b""
    s.run(setter, req(p.ADD, vec(b"y"), i64(1)))
    assert s.woken == [waiter] and bytes(waiter.outbuf) == bytes([p.STOP_WAITING])
    waiter.outbuf.clear()
    assert s.run(waiter, req(p.WAIT, vecs([b"x"]))) == bytes([p.STOP_WAITING])  # present: answered at once


def test_a_cancelled_wait_is_forgotten(conns: tuple[Connection, Connection]) -> None:
    waiter, setter = conns
    s = Store()
    s.run(waiter, req(p.WAIT, vecs([b"never"])))
    assert s.run(waiter, req(p.CANCEL_WAIT)) == bytes([p.WAIT_CANCELED])
    assert s.kv.waiters == {} and waiter.waiting == set()
    s.run(setter, req(p.SET, vec(b"never"), vec(b"1")))
    assert s.woken == []


def test_requests_the_store_cannot_take(conns: tuple[Connection, Connection]) -> None:
    c, _ = conns
    s = Store()
    with pytest.raises(ProtocolError, match="validation number 0x1"):
        s.run(c, req(p.VALIDATE, struct.pack("=I", 1)))
    with pytest.raises(ProtocolError, match="GET for a key that does not exist"):
        s.run(c, req(p.GET, vec(b"none")))
    s.run(c, req(p.SET, vec(b"text"), vec(b"abc")))
    with pytest.raises(ProtocolError, match="does not hold a number"):
        s.run(c, req(p.ADD, vec(b"text"), i64(1)))
    with pytest.raises(ProtocolError, match=r"request type 250 is newer .* `--store torch`"):
        s.run(c, bytes([250]))


def test_a_request_cut_short_changes_nothing(conns: tuple[Connection, Connection]) -> None:
    c, _ = conns
    s = Store()
    whole = req(p.SET, vec(b"k"), vec(b"value"))
    for cut in range(1, len(whole)):
        reader = Reader(bytearray(whole[:cut]))
        with pytest.raises(NeedMore):
            s.kv.execute(reader.u8(), c, reader)
    assert s.kv.data == {}


@pytest.mark.parametrize("code", [p.SET, p.ADD, p.APPEND, p.QUEUE_PUSH])
def test_a_rank_joined_once_a_torch_client_wrote_a_key(conns: tuple[Connection, Connection], code: int) -> None:
    """torch's clients write keys that start with "/"; ddpboot's node check (keys without it) is not a rank."""
    c, _ = conns
    s = Store()
    value = i64(1) if code == p.ADD else vec(b"v")
    s.run(c, req(p.SET, vec(b"ddpboot-nodes/0"), vec(b"2 host")))
    s.run(c, req(p.CHECK, vecs([b"/x"])))  # reading is not joining
    assert not s.kv.joined
    s.run(c, req(code, vec(b"/default_pg/0//init"), value))
    assert s.kv.joined
    s.kv.clear()  # a restart empties the store, but the job did join
    assert s.kv.joined


def _examples() -> dict[int, bytes]:
    """One request of each type, as torch's client sends it (its keys exist: every handler runs to its end)."""
    return {
        p.VALIDATE: req(p.VALIDATE, struct.pack("=I", p.VALIDATION_MAGIC)),
        p.SET: req(p.SET, vec(b"k"), vec(b"12")),
        p.COMPARE_SET: req(p.COMPARE_SET, vec(b"k"), vec(b"12"), vec(b"13")),
        p.GET: req(p.GET, vec(b"k")),
        p.ADD: req(p.ADD, vec(b"k"), i64(2)),
        p.CHECK: req(p.CHECK, vecs([b"k", b"k"])),
        p.WAIT: req(p.WAIT, vecs([b"k"])),
        p.GETNUMKEYS: req(p.GETNUMKEYS),
        p.DELETE_KEY: req(p.DELETE_KEY, vec(b"gone")),
        p.APPEND: req(p.APPEND, vec(b"k"), vec(b"0")),
        p.MULTI_GET: req(p.MULTI_GET, vecs([b"k", b"k"])),
        p.MULTI_SET: req(p.MULTI_SET, struct.pack("=Q", 2), vec(b"a"), vec(b"1"), vec(b"b"), vec(b"")),
        p.CANCEL_WAIT: req(p.CANCEL_WAIT),
        p.PING: req(p.PING, struct.pack("=I", 7)),
        p.QUEUE_PUSH: req(p.QUEUE_PUSH, vec(b"q"), vec(b"item")),
        p.QUEUE_POP: req(p.QUEUE_POP, vec(b"q")),
        p.QUEUE_LEN: req(p.QUEUE_LEN, vec(b"q")),
        p.LIST_KEYS: req(p.LIST_KEYS),
    }


def test_each_request_types_shape_reads_what_its_handler_reads(conns: tuple[Connection, Connection]) -> None:
    """COMMANDS' shapes against their handlers: the framer ends each example request where the handler stops
    reading it, and says it is unfinished one byte short of that."""
    c, _ = conns
    s = Store()
    examples = _examples()
    assert set(examples) == set(COMMANDS)
    for code, request in examples.items():
        s.run(c, request)  # asserts that the handler read the whole request
        assert Framer(SHAPES).end(bytearray(request), 0) == len(request), code
        assert Framer(SHAPES).end(bytearray(request[:-1]), 0) is None, code
