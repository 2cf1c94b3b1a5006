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
or --store-allow), a connection from an address outside it is closed the same way (allow.py).

The server listens on a socket the launcher bound itself (loopback, no port race) and lives in the guardian
process (launch/procs/guardian.py), so it serves every restart of the group; `reset()` empties it between attempts,
as torchrun gives each attempt a fresh store (stale keys of a dead attempt would otherwise be read by the next one,
e.g. gloo's peer addresses).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import sys
import time
from collections.abc import Callable

from ddpboot.tcpstore.allow import AddressGate, AllowList
from ddpboot.tcpstore.commands import Connection, KeyValues
from ddpboot.tcpstore.owner import Allow, OwnerGate, resolve_allowed_uids
from ddpboot.tcpstore.protocol import NeedMore, ProtocolError, Reader

TRACE_VAR = "DDPBOOT_STORE_TRACE"


class StoreServer:
    """torch's TCPStore server protocol over a selectors loop that the caller owns.

    `register()` adds the listening socket to the caller's selector; the caller passes every ready key whose
    `data` is this server to `handle()`. Single-threaded: requests are answered in arrival order, and a WAIT
    is parked until its keys exist.

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
        self.listener.setblocking(False)
        # Accepted sockets inherit TCP_NODELAY from the listener (Linux): one setsockopt here instead of one per
        # connection (answers are small and must leave at once).
        with contextlib.suppress(OSError):
            self.listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._received = bytearray(1 << 16)  # every recv lands here: no buffer allocated per read
        self._received_view = memoryview(self._received)
        self.sel: selectors.BaseSelector | None = None
        self.store = KeyValues(wake=self._flush)
        self.clients: dict[int, Connection] = {}
        self.warn = warn or (lambda msg: print(f"ddpboot: store: {msg}", file=sys.stderr, flush=True))
        self._warned: set[str] = set()
        allowed = resolve_allowed_uids(allowed_uids)
        self.gate = OwnerGate(allowed, self.warn) if allowed is not None else None
        self.hosts = AddressGate(allowed_hosts, self.warn) if allowed_hosts is not None else None
        # DDPBOOT_STORE_TRACE=FILE: one line per request (type and first bytes), to diagnose a client that hangs.
        trace = os.environ.get(TRACE_VAR)
        self.trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115

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
        self.store.clear()

    def close(self) -> None:
        self.reset()
        if self.sel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.listener)
        self.listener.close()
        if self.gate is not None:
            self.gate.close()

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
            if not self._admit(sock):
                sock.close()  # unread: the client gets no answer
                continue
            sock.setblocking(False)
            self.clients[sock.fileno()] = Connection(sock)
            self.sel.register(sock, selectors.EVENT_READ, self)

    def _admit(self, sock: socket.socket) -> bool:
        """The address rule first (a refused host is not looked up in the socket tables), then the uid rule."""
        if self.hosts is not None and not self.hosts.admit(sock):
            return False
        return self.gate is None or self.gate.admit(sock)

    def _drop(self, client: Connection) -> None:
        self.store.unpark(client)
        fd = client.sock.fileno()
        if self.sel is not None and fd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(client.sock)
        self.clients.pop(fd, None)
        client.sock.close()

    def _read(self, client: Connection) -> None:
        try:
            size = client.sock.recv_into(self._received)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)
            return
        if not size:
            self._drop(client)
            return
        client.inbuf += self._received_view[:size]
        while len(client.inbuf) >= client.need:
            reader = Reader(client.inbuf)
            try:
                self._execute(client, reader)
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

    def _execute(self, client: Connection, reader: Reader) -> None:
        """Run the request at the start of `reader` (NeedMore when it has not all arrived yet)."""
        query = reader.u8()
        if self.trace is not None:
            self.trace.write(f"{time.time():.4f} fd {client.sock.fileno()} type {query} {bytes(reader.buf[:64])!r}\n")
        self.store.execute(query, client, reader)

    def _flush(self, client: Connection) -> None:
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
        writing = bool(client.outbuf)
        if writing != client.writing:  # the selector is asked to change only when this changes
            assert self.sel is not None
            client.writing = writing
            with contextlib.suppress(KeyError, ValueError):
                self.sel.modify(client.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0), self)

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
        for key, events in sel.select():
            server.handle(key, events)


if __name__ == "__main__":  # python -m ddpboot.tcpstore.server FD: serve an inherited listening socket
    serve_forever(socket.socket(fileno=int(sys.argv[1])))
