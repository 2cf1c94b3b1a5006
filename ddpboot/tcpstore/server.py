"""The rendezvous store for a one-node job: torch's TCPStore wire protocol, served without importing torch.

Why not `torch.distributed.TCPStore(master_listen_fd=...)` in the launcher: on a 2-core machine the launcher's own
`import torch` (≈2 s there) competes with the workers' imports, and a job's launch→exit time grows by about that
much (measured: 0.80× torchrun with a torch-backed store process, 0.56× without one; benchmarks/RESULTS.md).
The store is a small key-value server; speaking its protocol here costs no import and a few MB.

The wire format is in protocol.py and what each request does in commands.py. A request type newer than those (torch
only ever appends codes) closes that client's connection with a message naming `--store torch` (torch's own server
on the same socket) as the way out.

Only the job's owner and root may use the store: a loopback connection of any other uid is closed as it is
accepted, before a byte of it is read (owner.py; docs/security.md). With an allow-list (the job's hosts under SLURM,
or --store-allow), a connection from an address outside it is closed the same way (allow.py). How many connections
are accepted at once, and what a full open-file table does, is intake.py's.

Limits: one request at most protocol.MAX_REQUEST bytes, the unfinished requests of all connections together at most
MAX_BUFFERED (beyond it the connection holding the most is closed), and a connection whose answers wait unsent
beyond OUT_LIMIT has its next requests wait (it is not read) until they have left. A request that arrives over many
reads is run once, whole, when a protocol.Framer says it has all arrived: never parsed again from its start.

The server listens on a socket the launcher bound itself (loopback, no port race) and lives in the guardian
process (launch/procs/guardian.py), so it serves every restart of the group; `reset()` empties it between attempts,
as torchrun gives each attempt a fresh store (stale keys of a dead attempt would otherwise be read by the next one,
e.g. gloo's peer addresses).
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import sys
import time
from collections.abc import Callable

from ddpboot.tcpstore.address import listening_sockets
from ddpboot.tcpstore.allow import AddressGate, AllowList
from ddpboot.tcpstore.commands import SHAPES, Connection, KeyValues
from ddpboot.tcpstore.intake import Intake
from ddpboot.tcpstore.owner import Allow, OwnerGate, resolve_allowed_uids
from ddpboot.tcpstore.protocol import Framer, NeedMore, ProtocolError, Reader

TRACE_VAR = "DDPBOOT_STORE_TRACE"
ACCEPT_EVERY = 256  # ready clients served between two looks at the listen queue
READY_BATCH = 4096  # ready sockets taken from the server's own epoll per handle()
MAX_BUFFERED = 256 << 20  # bytes of unfinished requests that all connections together may hold
OUT_LIMIT = 1 << 20  # bytes of unsent answers beyond which a connection's next requests wait


class StoreServer:
    """torch's TCPStore server protocol, inside a selectors loop that the caller owns.

    The server watches its listener and every client in an epoll of its own; `register()` adds that one epoll to
    the caller's selector, and the caller passes every ready key whose `data` is this server to `handle()`, which
    serves whatever is ready, the listen queue first (so the server, not the caller's loop, decides when
    connections are accepted). The caller also calls `handle()` once `timeout()` seconds have passed with nothing
    ready (connections held until their owner is known, a full table's listen queue to look at again).
    Single-threaded: requests are answered in arrival order, and a WAIT is parked until its keys exist.

    `allowed_uids`: the uids whose loopback connections are served; by default the server process's own uid and
    root (0). None turns the check off (only for tests of a store open to every local user).
    `allowed_hosts`: the addresses whose connections are served (allow.py); None: every address.
    """

    def __init__(
        self,
        listener: socket.socket,
        warn: Callable[[str], None] | None = None,
        *,
        allowed_uids: frozenset[int] | Allow | None = Allow.OWNER_AND_ROOT,
        allowed_hosts: AllowList | None = None,
    ) -> None:
        self.listener = listener
        self.listeners = listening_sockets(listener)  # several: a SO_REUSEPORT group (tcpstore/address.py)
        for sock in self.listeners:
            sock.setblocking(False)
            # Accepted sockets inherit TCP_NODELAY from the listener (Linux): one setsockopt here instead of one
            # per connection (answers are small and must leave at once).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._received = bytearray(1 << 16)  # every recv lands here: no buffer allocated per read
        self._received_view = memoryview(self._received)
        self.sel: selectors.BaseSelector | None = None
        self.poll = select.epoll()
        self.listen_fds = {sock.fileno(): sock for sock in self.listeners}
        for fd in self.listen_fds:
            self.poll.register(fd, select.EPOLLIN)
        self.store = KeyValues(wake=self._flush)
        self.clients: dict[int, Connection] = {}
        self.buffered = 0  # bytes held in every connection's inbuf
        self.warn = warn or (lambda msg: print(f"ddpboot: store: {msg}", file=sys.stderr, flush=True))
        self._warned: set[str] = set()
        allowed = resolve_allowed_uids(allowed_uids)
        self.gate = OwnerGate(allowed, self.warn) if allowed is not None else None
        self.hosts = AddressGate(allowed_hosts, self.warn) if allowed_hosts is not None else None
        # DDPBOOT_STORE_TRACE=FILE: one line per request (type and first bytes), to diagnose a client that hangs.
        trace = os.environ.get(TRACE_VAR)
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115
        self.intake = Intake(self.listeners, self.poll, self._admit, self.warn, lambda: len(self.clients))

    @property
    def joined(self) -> bool:
        """Whether any rank has joined the rendezvous (written a key of its process group) since the start."""
        return self.store.joined

    @property
    def data(self) -> dict[bytes, bytes]:
        """The keys and their values."""
        return self.store.data

    # --- wiring ----------------------------------------------------------------------------------

    def register(self, sel: selectors.BaseSelector) -> None:
        self.sel = sel
        sel.register(self.poll.fileno(), selectors.EVENT_READ, self)

    def timeout(self) -> float | None:
        """Seconds after which `handle()` has work though nothing is ready (None: none planned)."""
        return self.intake.timeout()

    def handle(self, key: selectors.SelectorKey | None = None, events: int = 0) -> None:
        """Serve what is ready now: new connections, requests, room to send answers (never blocks).

        The listen queue is emptied first and again every ACCEPT_EVERY events: while thousands of ranks connect
        at once, a queue left full makes the kernel drop their handshakes (each dropped one costs its client a
        retransmission, a second or more), whereas a request that waits a little costs nothing more."""
        ready_now = self.poll.poll(0, READY_BATCH)
        if self.intake.due() or any(fd in self.listen_fds for fd, _ in ready_now):
            self._accept()
        for count, (fd, ready) in enumerate(ready_now, 1):
            if count % ACCEPT_EVERY == 0:
                self._accept()
            client = self.clients.get(fd)
            if client is None:
                continue
            if ready & select.EPOLLOUT:
                self._flush(client)
            if ready & ~select.EPOLLOUT and fd in self.clients and not client.held_back:  # data, hang-up, error
                self._read(client)

    def reset(self) -> None:
        """Forget every key, queue and connection: the next attempt starts from an empty store."""
        for client in list(self.clients.values()):
            self._drop(client)
        self.store.clear()

    def close(self) -> None:
        self.reset()
        self.intake.close()
        if self.sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.poll.fileno())
        self.poll.close()
        self.listener.close()
        if self.gate is not None:
            self.gate.close()

    # --- connections -----------------------------------------------------------------------------

    def _accept(self) -> None:
        """Serve the connections the intake accepted and admitted (intake.py)."""
        for sock in self.intake.take():
            sock.setblocking(False)
            fd = sock.fileno()
            self.clients[fd] = Connection(sock, events=select.EPOLLIN)
            self.poll.register(fd, select.EPOLLIN)

    def _admit(self, socks: list[socket.socket]) -> list[bool | None]:
        """The address rule first (a refused host is not looked up in the socket tables), then the uid rule (None:
        its owner cannot be known yet)."""
        verdicts = [self.hosts.admit(sock) for sock in socks] if self.hosts is not None else [True] * len(socks)
        if self.gate is None:
            return list(verdicts)
        owners = iter(self.gate.admit_many([sock for sock, ok in zip(socks, verdicts, strict=True) if ok]))
        return [next(owners) if ok else False for ok in verdicts]

    def _drop(self, client: Connection) -> None:
        self.store.unpark(client)
        self.buffered -= len(client.inbuf)
        client.inbuf.clear()
        fd = client.sock.fileno()
        if fd >= 0:
            with contextlib.suppress(OSError, ValueError):
                self.poll.unregister(fd)
        self.clients.pop(fd, None)
        client.sock.close()
        self.intake.room_freed()

    def _io(self, client: Connection, op: Callable[[bytearray], int], buf: bytearray) -> int | None:
        """One non-blocking `op` (the socket's recv_into or send) on `buf`: the bytes it moved, or None when it would
        block or the connection broke (then it is dropped, its socket closed)."""
        try:
            return op(buf)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            self._drop(client)
            return None

    def _read(self, client: Connection) -> None:
        size = self._io(client, client.sock.recv_into, self._received)
        if size is None:
            return
        if not size:
            self._drop(client)
            return
        # Requests are parsed where they landed; only an unfinished one is kept, in the connection's inbuf.
        if not client.inbuf:
            served = self._take(client, self._received_view[:size])
        else:
            served = self._keep(client, self._received_view[:size]) and self._take(client, client.inbuf)
        if served:
            self._flush(client)

    def _take(self, client: Connection, data: bytearray | memoryview) -> bool:
        """Run every whole request at the start of `data` while the connection's answers may still grow; keep what
        is left in its inbuf. False when the connection was closed (a request it may not send)."""
        reader = Reader(data)
        try:
            while reader.pos < len(data):
                if len(client.outbuf) > OUT_LIMIT:
                    client.held_back = True
                    break
                start = reader.pos
                if client.frame is not None:  # the rest of a request that arrived cut short
                    if client.frame.end(data, start) is None:
                        break
                    client.frame = None
                try:
                    self._execute(client, reader, start)
                except NeedMore:
                    reader.pos = start
                    client.frame = Framer(SHAPES)
                    client.frame.end(data, start)  # reads the lengths there are, and checks them
                    break
        except ProtocolError as exc:
            self._warn_once(exc.kind, f"closing a client connection: {exc}")
            self._drop(client)
            return False
        if data is client.inbuf:
            del client.inbuf[: reader.pos]
            self.buffered -= reader.pos
            return True
        return reader.pos == len(data) or self._keep(client, data[reader.pos :])

    def _keep(self, client: Connection, data: bytearray | memoryview) -> bool:
        """Add `data` to the connection's unfinished request; False when the connection was closed to keep every
        connection's unfinished requests within MAX_BUFFERED (the one that holds the most is closed)."""
        while self.buffered + len(data) > MAX_BUFFERED:
            largest = max(self.clients.values(), key=lambda c: len(c.inbuf) + (len(data) if c is client else 0))
            self._warn_once(
                "buffered", f"closing a client connection: the unfinished requests of all connections would hold "
                f"more than {MAX_BUFFERED >> 20} MiB, and it holds the most ({len(largest.inbuf)} bytes)")
            self._drop(largest)
            if largest is client:
                return False
        client.inbuf += data
        self.buffered += len(data)
        return True

    def _execute(self, client: Connection, reader: Reader, start: int) -> None:
        """Run the request at `start` in `reader` (NeedMore when it has not all arrived yet)."""
        query = reader.u8()
        if self.trace is not None:
            self.trace.write(
                f"{time.time():.4f} fd {client.sock.fileno()} type {query} {bytes(reader.buf[start : start + 64])!r}\n"
            )
        self.store.execute(query, client, reader)

    def _flush(self, client: Connection) -> None:
        """Send what the connection's answers hold; run its held-back requests once they may go on."""
        while True:
            if client.sock.fileno() < 0:
                return
            while client.outbuf and (sent := self._io(client, client.sock.send, client.outbuf)) is not None:
                del client.outbuf[:sent]
            if client.sock.fileno() < 0:  # dropped
                return
            if not client.held_back or len(client.outbuf) > OUT_LIMIT:
                break
            client.held_back = False
            if not self._take(client, client.inbuf):
                return
        events = (0 if client.held_back else select.EPOLLIN) | (select.EPOLLOUT if client.outbuf else 0)
        if events != client.events:  # the epoll is asked to change only when this changes
            client.events = events
            with contextlib.suppress(OSError, ValueError):
                self.poll.modify(client.sock.fileno(), events)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.warn(message)


def serve_forever(listener: socket.socket) -> None:
    """Serve on `listener` until the process is killed (tests and benchmarks; the launcher uses the guardian)."""
    sel = selectors.DefaultSelector()
    server = StoreServer(listener)
    server.register(sel)
    while True:
        sel.select(server.timeout())  # the server's epoll is ready, or the timeout passed: either way, handle()
        server.handle()


if __name__ == "__main__":  # python -m ddpboot.tcpstore.server FD: serve an inherited listening socket
    serve_forever(socket.socket(fileno=int(sys.argv[1])))
