"""The store's contents and one handler per request type: what each of torch's TCPStore requests reads, changes
and answers (protocol.py has the wire format, server.py the connections).

A handler reads every argument of its request before it changes anything: a request cut short raises NeedMore
from the Reader and is run again, whole, once the rest has arrived. Answers are queued on the connection in the
order torch's own server sends them; a new request type is one handler and one entry in COMMANDS, which also says
the shape of its arguments (how the server finds where a request ends before it runs the handler).
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpboot.tcpstore.protocol import (
    ADD,
    APPEND,
    BLOB,
    CANCEL_WAIT,
    CHECK,
    COMPARE_SET,
    DELETE_KEY,
    GET,
    GETNUMKEYS,
    I64,
    KEYS,
    LIST_KEYS,
    MULTI_GET,
    MULTI_SET,
    NOT_READY,
    PAIRS,
    PING,
    QUEUE_LEN,
    QUEUE_POP,
    QUEUE_PUSH,
    READY,
    SET,
    STOP_WAITING,
    U8,
    U32,
    VALIDATE,
    VALIDATION_MAGIC,
    WAIT,
    WAIT_CANCELED,
    Framer,
    ProtocolError,
    Reader,
    Shape,
    vec,
)


@dataclass(eq=False)
class Connection:
    """One client's connection: bytes received but not yet taken, answers not yet sent, and the keys its parked
    WAIT still misses."""

    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    frame: Framer | None = None  # where the unfinished request in inbuf ends, found as it arrives
    outbuf: bytearray = field(default_factory=bytearray)
    waiting: set[bytes] = field(default_factory=set)
    events: int = 0  # what its socket is registered for in the server's epoll
    held_back: bool = False  # its requests wait until its answers have left (server.OUT_LIMIT)

    def answer(self, data: bytes) -> None:
        self.outbuf += data


class KeyValues:
    """The keys, queues and parked WAITs of one store. `wake(connection)` is called when a parked WAIT has been
    answered, so that the server sends that answer at once."""

    def __init__(self, wake: Callable[[Connection], None]) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self.waiters: dict[bytes, set[Connection]] = {}
        self.wake = wake
        # Whether a rank joined the rendezvous: torch's clients write keys that start with "/" (ddpboot's own node
        # check does not). Kept across clear(): the launcher asks once, after the last attempt.
        self.joined = False

    def execute(self, query: int, conn: Connection, args: Reader) -> None:
        """Run request `query` of `conn`, its arguments read from `args`; ProtocolError for an unknown type."""
        command = COMMANDS.get(query)
        if command is None:
            raise ProtocolError(
                f"request type {query} is newer than this store speaks (torch's TCPStore protocol up to "
                f"LIST_KEYS={LIST_KEYS}); run the job with `--store torch` to use torch's own store server"
            )
        command[0](self, conn, args)

    def clear(self) -> None:
        self.data.clear()
        self.queues.clear()
        self.waiters.clear()

    def present(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def changed(self, key: bytes) -> None:
        """`key` now exists: answer every WAIT that was missing only it."""
        if key.startswith(b"/"):
            self.joined = True
        for conn in self.waiters.pop(key, set()):
            conn.waiting.discard(key)
            if not conn.waiting:
                conn.answer(U8.pack(STOP_WAITING))
                self.wake(conn)

    def park(self, conn: Connection, missing: set[bytes]) -> None:
        """Hold `conn`'s WAIT until every key of `missing` exists."""
        conn.waiting = missing
        for key in missing:
            self.waiters.setdefault(key, set()).add(conn)

    def unpark(self, conn: Connection) -> None:
        """Forget `conn`'s WAIT (cancelled, or the connection is gone)."""
        for key in conn.waiting:
            waiting = self.waiters.get(key)
            if waiting is not None:
                waiting.discard(conn)
                if not waiting:
                    del self.waiters[key]
        conn.waiting = set()


# --- one handler per request type --------------------------------------------------------------------------------

Handler = Callable[[KeyValues, Connection, Reader], None]


def _validate(kv: KeyValues, conn: Connection, args: Reader) -> None:
    magic = args.u32()
    if magic != VALIDATION_MAGIC:
        raise ProtocolError(f"a client sent validation number {magic:#x}, not torch's {VALIDATION_MAGIC:#x}",
                            "validation")


def _ping(kv: KeyValues, conn: Connection, args: Reader) -> None:
    conn.answer(U32.pack(args.u32()))


def _set(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key, value = args.blob(), args.blob()
    kv.data[key] = value
    kv.changed(key)


def _compare_set(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key, expected, desired = args.blob(), args.blob(), args.blob()
    current = kv.data.get(key)
    if current is None and expected != b"":
        conn.answer(vec(expected))  # what torch's server answers for a missing key
        return
    if current is None or current == expected:
        kv.data[key] = desired
        kv.changed(key)
    conn.answer(vec(kv.data[key]))


def _get(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key = args.blob()
    if key not in kv.data:
        raise ProtocolError("a GET for a key that does not exist")
    conn.answer(vec(kv.data[key]))


def _add(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key, delta = args.blob(), args.i64()
    try:
        total = int(kv.data.get(key, b"0")) + delta
    except ValueError:
        raise ProtocolError("an ADD to a key that does not hold a number") from None
    kv.data[key] = str(total).encode()
    conn.answer(I64.pack(total))
    kv.changed(key)


def _check(kv: KeyValues, conn: Connection, args: Reader) -> None:
    keys = args.blobs()
    conn.answer(U8.pack(READY if all(kv.present(k) for k in keys) else NOT_READY))


def _wait(kv: KeyValues, conn: Connection, args: Reader) -> None:
    missing = {k for k in args.blobs() if not kv.present(k)}
    if missing:
        kv.park(conn, missing)
    else:
        conn.answer(U8.pack(STOP_WAITING))


def _cancel_wait(kv: KeyValues, conn: Connection, args: Reader) -> None:
    kv.unpark(conn)
    conn.answer(U8.pack(WAIT_CANCELED))


def _num_keys(kv: KeyValues, conn: Connection, args: Reader) -> None:
    conn.answer(I64.pack(len(kv.data)))


def _delete_key(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key = args.blob()
    conn.answer(I64.pack(1 if kv.data.pop(key, None) is not None else 0))


def _append(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key, value = args.blob(), args.blob()
    kv.data[key] = kv.data.get(key, b"") + value
    kv.changed(key)


def _multi_get(kv: KeyValues, conn: Connection, args: Reader) -> None:
    keys = args.blobs()
    if any(k not in kv.data for k in keys):
        raise ProtocolError("a MULTI_GET for a key that does not exist")
    conn.answer(b"".join(vec(kv.data[k]) for k in keys))


def _multi_set(kv: KeyValues, conn: Connection, args: Reader) -> None:
    pairs = [(args.blob(), args.blob()) for _ in range(args.count("a MULTI_SET"))]
    for key, value in pairs:
        kv.data[key] = value
    for key, _ in pairs:
        kv.changed(key)


def _queue_push(kv: KeyValues, conn: Connection, args: Reader) -> None:
    key, value = args.blob(), args.blob()
    kv.queues.setdefault(key, deque()).append(value)
    kv.changed(key)


def _queue_pop(kv: KeyValues, conn: Connection, args: Reader) -> None:
    queue = kv.queues.get(args.blob())
    conn.answer(I64.pack(1) + vec(queue.popleft()) if queue else I64.pack(0))


def _queue_len(kv: KeyValues, conn: Connection, args: Reader) -> None:
    conn.answer(I64.pack(len(kv.queues.get(args.blob(), ()))))


def _list_keys(kv: KeyValues, conn: Connection, args: Reader) -> None:
    keys = list(kv.data)
    conn.answer(I64.pack(len(keys)) + b"".join(vec(k) for k in keys))


# Each request type's handler, and the shape of its arguments (protocol.Framer): they read the same fields.
COMMANDS: dict[int, tuple[Handler, Shape]] = {
    VALIDATE: (_validate, (U32.size,)),
    SET: (_set, (BLOB, BLOB)),
    COMPARE_SET: (_compare_set, (BLOB, BLOB, BLOB)),
    GET: (_get, (BLOB,)),
    ADD: (_add, (BLOB, I64.size)),
    CHECK: (_check, (KEYS,)),
    WAIT: (_wait, (KEYS,)),
    GETNUMKEYS: (_num_keys, ()),
    DELETE_KEY: (_delete_key, (BLOB,)),
    APPEND: (_append, (BLOB, BLOB)),
    MULTI_GET: (_multi_get, (KEYS,)),
    MULTI_SET: (_multi_set, (PAIRS,)),
    CANCEL_WAIT: (_cancel_wait, ()),
    PING: (_ping, (U32.size,)),
    QUEUE_PUSH: (_queue_push, (BLOB, BLOB)),
    QUEUE_POP: (_queue_pop, (BLOB,)),
    QUEUE_LEN: (_queue_len, (BLOB,)),
    LIST_KEYS: (_list_keys, ()),
}
SHAPES: dict[int, Shape] = {code: shape for code, (_, shape) in COMMANDS.items()}
