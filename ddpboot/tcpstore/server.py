"""The rendezvous store for a one-node job: torch's TCPStore wire protocol, served without importing torch.

Why not `torch.distributed.TCPStore(master_listen_fd=...)` in the launcher: on a 2-core machine the launcher's own
`import torch` (≈2 s there) competes with the workers' imports, and a job's launch→exit time grows by about that
much (measured: 0.80× torchrun with a torch-backed store process, 0.56× without one; benchmarks/RESULTS.md).
The store is a small key-value server; speaking its protocol here costs no import and a few MB.

The protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp, checked byte by byte against torch 2.13's own
server through a recording proxy): a request is one QueryType byte followed by its arguments; strings and byte
vectors are a native uint64 length and the bytes; integers are native int64. Codes are only ever appended in torch,
so a newer client speaks the same codes plus new ones; an unknown code closes that client's connection with a
message naming `--store torch` (torch's own server on the same socket) as the way out.

The server listens on a socket the launcher bound itself (loopback, no port race) and lives in the guardian
process (guardian.py), so it serves every restart of the group; `reset()` empties it between attempts, as torchrun
gives each attempt a fresh store (stale keys of a dead attempt would otherwise be read by the next one, e.g. gloo's
peer addresses).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

VALIDATION_MAGIC = 0x3C85F7CE
TRACE_VAR = "DDPBOOT_STORE_TRACE"

# QueryType, in torch's order (TCPStoreBackend.hpp).
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS = range(10, 18)

READY, NOT_READY = 0, 1  # CheckResponseType
STOP_WAITING, WAIT_CANCELED = 0, 1  # WaitResponseType

_U8 = struct.Struct("=B")
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_I64 = struct.Struct("=q")
_MAX_LEN = 1 << 40  # a length beyond this is a corrupt stream, not a value


class NeedMore(Exception):
    """The buffer does not hold a whole request yet; `total` is a lower bound of the bytes it needs."""

    def __init__(self, total: int) -> None:
        self.total = total


class ProtocolError(Exception):
    """A request this server cannot take: the connection is closed."""


class _Reader:
    """Reads one request's fields out of a buffer, raising NeedMore when it runs short."""

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise NeedMore(end)
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def u8(self) -> int:
        return int(_U8.unpack(self._take(1))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self._take(8))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def blob(self) -> bytes:
        n = self.u64()
        if n > _MAX_LEN:
            raise ProtocolError(f"a value of {n} bytes")
        return self._take(n)

    def blobs(self) -> list[bytes]:
        n = self.u64()
        if n > _MAX_LEN:
            raise ProtocolError(f"a list of {n} keys")
        return [self.blob() for _ in range(n)]


def _vec(value: bytes) -> bytes:
    return _U64.pack(len(value)) + value


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    need: int = 1
    outbuf: bytearray = field(default_factory=bytearray)
    waiting: set[bytes] = field(default_factory=set)


class StoreServer:
    """torch's TCPStore server protocol over a selectors loop that the caller owns.

    `register()` adds the listening socket to the caller's selector; the caller passes every ready key whose
    `data` is this server to `handle()`. Single-threaded: requests are answered in arrival order, and a WAIT
    is parked until its keys exist.
    """

    def __init__(self, listener: socket.socket, warn: Callable[[str], None] | None = None) -> None:
        self.listener = listener
        self.listener.setblocking(False)
        self.sel: selectors.BaseSelector | None = None
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}
        self.waiters: dict[bytes, set[_Client]] = {}
        self.clients: dict[int, _Client] = {}
        self.warn = warn or (lambda msg: print(f"ddpboot: store: {msg}", file=sys.stderr, flush=True))
        self._warned: set[str] = set()
        # DDPBOOT_STORE_TRACE=FILE: one line per request (type and first bytes), to diagnose a client that hangs.
        trace = os.environ.get(TRACE_VAR)
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115

    # --- wiring ----------------------------------------------------------------------------------

    def register(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        sel.register(self.listener, selectors.EVENT_READ, self)

    def handle(self, key: selectors.SelectorKey, events: int) -> None:
        if key.fileobj is self.listener:
            self._accept()
            return
        client = self.clients.get(key.fd)
        if client is None:
            return
        if events & selectors.EVENT_WRITE:
            self._flush(client)
        if events & selectors.EVENT_READ and key.fd in self.clients:
            self._read(client)

    def reset(self) -> None:
        """Forget every key, queue and connection: the next attempt starts from an empty store."""
        for client in list(self.clients.values()):
            self._drop(client)
        self.data.clear()
        self.queues.clear()
        self.waiters.clear()

    def close(self) -> None:
        self.reset()
        if self.sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.listener)
        self.listener.close()

    # --- connections -----------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self.sel is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                self._warn_once("accept", f"cannot accept a connection: {exc}")
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _Client(sock)
            self.clients[sock.fileno()] = client
            self.sel.register(sock, selectors.EVENT_READ, self)

    def _drop(self, client: _Client) -> None:
        for key in client.waiting:
            waiting = self.waiters.get(key)
            if waiting is not None:
                waiting.discard(client)
                if not waiting:
                    del self.waiters[key]
        client.waiting.clear()
        fd = client.sock.fileno()
        if self.sel is not None and fd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(client.sock)
        self.clients.pop(fd, None)
        client.sock.close()

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)
            return
        if not chunk:
            self._drop(client)
            return
        client.inbuf += chunk
        while len(client.inbuf) >= client.need:
            reader = _Reader(client.inbuf)
            try:
                self._dispatch(client, reader)
            except NeedMore as more:
                client.need = more.total
                break
            except ProtocolError as exc:
                self._warn_once(str(exc), f"closing a client connection: {exc}")
                self._drop(client)
                return
            del client.inbuf[: reader.pos]
            client.need = 1
        self._flush(client)

    def _send(self, client: _Client, data: bytes) -> None:
        client.outbuf += data

    def _flush(self, client: _Client) -> None:
        if client.sock.fileno() < 0:
            return
        while client.outbuf:
            try:
                sent = client.sock.send(client.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(client)
                return
            del client.outbuf[:sent]
        assert self.sel is not None
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbuf else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self.sel.get_key(client.sock).events != want:
                self.sel.modify(client.sock, want, self)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warn(message)

    # --- requests --------------------------------------------------------------------------------

    def _present(self, key: bytes) -> bool:
        return key in self.data or bool(self.queues.get(key))

    def _changed(self, key: bytes) -> None:
        """`key` now exists: answer every WAIT that was missing only it."""
        for client in self.waiters.pop(key, set()):
            client.waiting.discard(key)
            if not client.waiting:
                self._send(client, _U8.pack(STOP_WAITING))
                self._flush(client)

    def _dispatch(self, client: _Client, r: _Reader) -> None:
        query = r.u8()
        if self.trace is not None:
            self.trace.write(f"{time.time():.4f} fd {client.sock.fileno()} type {query} {bytes(r.buf[:64])!r}\n")
        if query == VALIDATE:
            magic = r.u32()
            if magic != VALIDATION_MAGIC:
                raise ProtocolError(f"a client sent validation number {magic:#x}, not torch's {VALIDATION_MAGIC:#x}")
        elif query == PING:
            self._send(client, _U32.pack(r.u32()))
        elif query == SET:
            key, value = r.blob(), r.blob()
            self.data[key] = value
            self._changed(key)
        elif query == COMPARE_SET:
            key, expected, desired = r.blob(), r.blob(), r.blob()
            current = self.data.get(key)
            if current is None:
                if expected == b"":
                    self.data[key] = desired
                    self._changed(key)
                    self._send(client, _vec(desired))
                else:
                    self._send(client, _vec(expected))  # what torch's server answers for a missing key
            else:
                if current == expected:
                    self.data[key] = desired
                    self._changed(key)
                self._send(client, _vec(self.data[key]))
        elif query == GET:
            key = r.blob()
            if key not in self.data:
                raise ProtocolError("a GET for a key that does not exist")
            self._send(client, _vec(self.data[key]))
        elif query == ADD:
            key, delta = r.blob(), r.i64()
            try:
                total = int(self.data.get(key, b"0")) + delta
            except ValueError:
                raise ProtocolError("an ADD to a key that does not hold a number") from None
            self.data[key] = str(total).encode()
            self._send(client, _I64.pack(total))
            self._changed(key)
        elif query == CHECK:
            keys = r.blobs()
            self._send(client, _U8.pack(READY if all(self._present(k) for k in keys) else NOT_READY))
        elif query == WAIT:
            missing = {k for k in r.blobs() if not self._present(k)}
            if not missing:
                self._send(client, _U8.pack(STOP_WAITING))
            else:
                client.waiting = missing
                for k in missing:
                    self.waiters.setdefault(k, set()).add(client)
        elif query == CANCEL_WAIT:
            for k in client.waiting:
                waiting = self.waiters.get(k)
                if waiting is not None:
                    waiting.discard(client)
                    if not waiting:
                        del self.waiters[k]
            client.waiting = set()
            self._send(client, _U8.pack(WAIT_CANCELED))
        elif query == GETNUMKEYS:
            self._send(client, _I64.pack(len(self.data)))
        elif query == DELETE_KEY:
            key = r.blob()
            self._send(client, _I64.pack(1 if self.data.pop(key, None) is not None else 0))
        elif query == APPEND:
            key, value = r.blob(), r.blob()
            self.data[key] = self.data.get(key, b"") + value
            self._changed(key)
        elif query == MULTI_GET:
            keys = r.blobs()
            if any(k not in self.data for k in keys):
                raise ProtocolError("a MULTI_GET for a key that does not exist")
            self._send(client, b"".join(_vec(self.data[k]) for k in keys))
        elif query == MULTI_SET:
            n = r.u64()
            if n > _MAX_LEN:
                raise ProtocolError(f"a MULTI_SET of {n} keys")
            pairs = [(r.blob(), r.blob()) for _ in range(n)]
            for key, value in pairs:
                self.data[key] = value
            for key, _ in pairs:
                self._changed(key)
        elif query == QUEUE_PUSH:
            key, value = r.blob(), r.blob()
            self.queues.setdefault(key, deque()).append(value)
            self._changed(key)
        elif query == QUEUE_POP:
            key = r.blob()
            queue = self.queues.get(key)
            if queue:
                self._send(client, _I64.pack(1) + _vec(queue.popleft()))
            else:
                self._send(client, _I64.pack(0))
        elif query == QUEUE_LEN:
            key = r.blob()
            self._send(client, _I64.pack(len(self.queues.get(key, ()))))
        elif query == LIST_KEYS:
            keys = list(self.data)
            self._send(client, _I64.pack(len(keys)) + b"".join(_vec(k) for k in keys))
        else:
            raise ProtocolError(
                f"request type {query} is newer than this store speaks (torch's TCPStore protocol up to "
                f"LIST_KEYS={LIST_KEYS}); run the job with `--store torch` to use torch's own store server"
            )


def serve_forever(listener: socket.socket) -> None:
    """Serve on `listener` until the process is killed (tests and benchmarks; the launcher uses the guardian)."""
    sel = selectors.DefaultSelector()
    server = StoreServer(listener)
    server.register(sel)
    while True:
        for key, events in sel.select():
            server.handle(key, events)


if __name__ == "__main__":  # python -m ddpboot.tcpstore.server FD: serve an inherited listening socket
    serve_forever(socket.socket(fileno=int(sys.argv[1])))
