"""A small client of torch's TCPStore protocol, for launchers talking to each other through node 0's store.

Why not `torch.distributed.TCPStore(is_master=False)`: the launcher never imports torch (≈2 s on a small machine,
and it competes with the workers' own imports). The few requests a launcher needs (SET, GET, ADD, CHECK, WAIT with
a deadline) are a few lines each over the wire format of protocol.py. The client validates first (VALIDATE +
torch's magic number), as torch's own client does, so it speaks to ddpboot's server and torch's alike.

Every call has a deadline: a node that never shows up, or a store that went away, becomes a StoreTimeout or a
StoreGone, never a hang.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from ddpboot.tcpstore.protocol import (
    ADD,
    CANCEL_WAIT,
    CHECK,
    GET,
    I64,
    MULTI_GET,
    READY,
    SET,
    STOP_WAITING,
    U8,
    U32,
    U64,
    VALIDATE,
    VALIDATION_MAGIC,
    WAIT,
    WAIT_CANCELED,
    vec,
    vecs,
)

ANSWER_TIMEOUT = 30.0  # seconds a request waits for the store to take it and answer, unless told otherwise
TICK = 0.5  # at most this many seconds pass between two calls of a long wait's `tick`


class StoreGone(ConnectionError):
    """The store closed the connection or cannot be reached."""


class StoreTimeout(TimeoutError):
    """A request's deadline passed before the store answered (e.g. a WAIT for a key nobody set)."""


def _key(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


class StoreClient:
    """One connection to a TCPStore server. Not thread-safe: one request at a time, as the protocol is."""

    def __init__(
        self, host: str, port: int, connect_timeout: float = 30.0, tick: Callable[[], None] | None = None
    ) -> None:
        """Connect, retrying refused connections until `connect_timeout` (node 0's launcher may start later);
        `tick` is called between attempts, at least every TICK s (it may raise to end the wait)."""
        self.address = f"{host}:{port}"
        deadline = time.monotonic() + connect_timeout
        last: OSError | None = None
        while True:
            if tick is not None:
                tick()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreGone(f"cannot connect to the store at {self.address} within {connect_timeout:g} s ({last})")
            try:
                self.sock = socket.create_connection((host, port), timeout=min(left, TICK if tick else 5.0))
                break
            except OSError as exc:  # refused (not listening yet), unreachable, or timed out: retry until the deadline
                last = exc
                time.sleep(min(0.05, max(left, 0.0)))  # back-off between connection attempts, not a wait for a result
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send(U8.pack(VALIDATE) + U32.pack(VALIDATION_MAGIC))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- wire ---------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self.sock.settimeout(ANSWER_TIMEOUT)
            self.sock.sendall(data)
        except OSError as exc:
            raise StoreGone(f"the store at {self.address} went away: {exc}") from None

    def _recv(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise StoreTimeout(f"no answer from the store at {self.address} in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise StoreTimeout(f"no answer from the store at {self.address} in time") from None
            except OSError as exc:
                raise StoreGone(f"the store at {self.address} went away: {exc}") from None
            if not chunk:
                raise StoreGone(f"the store at {self.address} closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv_u8(self, timeout: float) -> int:
        return int(U8.unpack(self._recv(1, time.monotonic() + timeout))[0])

    def _recv_vec(self, deadline: float | None) -> bytes:
        n = int(U64.unpack(self._recv(8, deadline))[0])
        return self._recv(n, deadline)

    # --- requests -----------------------------------------------------------------------------------

    def set(self, key: str | bytes, value: str | bytes) -> None:
        self._send(U8.pack(SET) + vec(_key(key)) + vec(_key(value)))

    def add(self, key: str | bytes, delta: int, timeout: float = ANSWER_TIMEOUT) -> int:
        self._send(U8.pack(ADD) + vec(_key(key)) + I64.pack(delta))
        return int(I64.unpack(self._recv(8, time.monotonic() + timeout))[0])

    def check(self, keys: Sequence[str | bytes], timeout: float = ANSWER_TIMEOUT) -> bool:
        """Whether every key exists now (no waiting)."""
        self._send(U8.pack(CHECK) + vecs(_key(k) for k in keys))
        return self._recv_u8(timeout) == READY

    def wait(self, keys: Sequence[str | bytes], timeout: float, tick: Callable[[], None] | None = None) -> None:
        """Block until every key exists; StoreTimeout after `timeout` seconds (the wait is then cancelled on the
        server, so the connection stays usable). With `tick`, the wait is cut into waits of TICK s with a call of
        `tick` after each (it may raise to end the wait)."""
        if tick is None:
            self._wait(keys, timeout)
            return
        deadline = time.monotonic() + timeout
        while True:
            tick()
            left = deadline - time.monotonic()
            try:
                self._wait(keys, max(min(left, TICK), 0.0))
                return
            except StoreTimeout:
                if left <= TICK:
                    raise

    def _wait(self, keys: Sequence[str | bytes], timeout: float) -> None:
        self.begin_wait(keys)
        self.end_wait(timeout)

    def fileno(self) -> int:
        """The connection's socket: readable once the answer to `begin_wait` arrived (for a select loop)."""
        return self.sock.fileno()

    def begin_wait(self, keys: Sequence[str | bytes]) -> None:
        """Ask for a wait until every key exists, without waiting here: the answer arrives on `fileno()`, and
        `end_wait` reads it (or cancels the wait after `timeout`). No other request may come in between."""
        self._send(U8.pack(WAIT) + vecs(_key(k) for k in keys))

    def end_wait(self, timeout: float) -> None:
        """The end of a wait `begin_wait` asked for: its answer within `timeout` s, else StoreTimeout (the wait
        cancelled on the server, so the connection stays usable)."""
        try:
            answer = self._recv_u8(timeout)
        except StoreTimeout:
            self._send(U8.pack(CANCEL_WAIT))
            answer = self._recv_u8(ANSWER_TIMEOUT)
            if answer == STOP_WAITING:  # the keys arrived just as we gave up; the cancel's own answer follows
                self._recv_u8(ANSWER_TIMEOUT)
                return
            if answer == WAIT_CANCELED:
                raise
            raise StoreGone(f"the store at {self.address} answered a cancelled wait with {answer}") from None
        if answer != STOP_WAITING:
            raise StoreGone(f"the store at {self.address} answered a wait with {answer}")

    def multi_get(self, keys: Sequence[str | bytes], timeout: float = ANSWER_TIMEOUT) -> list[bytes]:
        """The values of `keys`, which must all exist already (the store closes the connection otherwise), in one
        round trip: what a node reads about every other node costs one request, not one per node."""
        self._send(U8.pack(MULTI_GET) + vecs(_key(k) for k in keys))
        deadline = time.monotonic() + timeout
        return [self._recv_vec(deadline) for _ in keys]

    def get(self, key: str | bytes, timeout: float = ANSWER_TIMEOUT) -> bytes:
        """The value of `key`, waiting up to `timeout` seconds for it to be set (as torch's client does)."""
        self.wait([key], timeout)
        self._send(U8.pack(GET) + vec(_key(key)))
        return self._recv_vec(time.monotonic() + ANSWER_TIMEOUT)
