"""Where a store listens: loopback names, and the listening socket bound once by whoever serves the store.

The launcher binds the socket itself (port 0: any free port) and hands it to the store's server, so no other
process can take the port between choosing and using it; the listen backlog leaves room for every rank at once.

Where more connections arrive at once than one listen queue holds (the kernel caps every queue at
net.core.somaxconn), the store listens on a group of sockets bound to one address and port with SO_REUSEPORT
(`listeners` > 1): each has its own queue and the kernel spreads new connections over them, so a burst of ranks is
not dropped and retried a second later. Linux lets only sockets of the same user join such a group; ddpboot also
checks, before binding and after (where /proc/net/tcp can be read), that no socket but the group's listens on that
port, so that two jobs given the same --master-port still fail as with one socket, instead of sharing connections.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path
from typing import Any

from ddpboot.errors import UsageError
from ddpboot.tcpstore.allow import plain_address
from ddpboot.tcpstore.peer import proc_address

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")

LISTEN_BACKLOG = 65535
"""Connections the kernel queues before the store accepts them; it caps this at net.core.somaxconn (4096 by default
on current kernels). Every rank connects at once at the start: past the queue, a client's SYN is dropped and retried
a second later, so a small queue costs a large job whole seconds."""

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
TCP_LISTEN = "0A"  # the state column of a listening socket in /proc/net/tcp


class ListenerGroup(socket.socket):
    """The first of several sockets listening on one address and port (SO_REUSEPORT), each with its own listen
    queue. The launcher hands this one socket around; a server accepts on `sockets()`; closing it closes them all."""

    siblings: list[socket.socket]

    def sockets(self) -> list[socket.socket]:
        return [self, *self.siblings]

    def close(self) -> None:
        for sibling in getattr(self, "siblings", ()):
            sibling.close()
        super().close()


def listening_sockets(sock: socket.socket) -> list[socket.socket]:
    """The sockets a store server accepts on: a group's members, or the one socket."""
    return sock.sockets() if isinstance(sock, ListenerGroup) else [sock]


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def store_host(host: str) -> str:
    """The address a store on `host` listens on and its clients are given: 127.0.0.1 for a loopback name (localhost
    may resolve to ::1 first), any address as it is (127.0.0.2 is an address of its own, where a store of a node
    named so must listen)."""
    return "127.0.0.1" if host.lower() in LOOPBACK_NAMES else host


def bind_store_socket(
    host: str, port: int | None, option: str = "--master-port", *, listeners: int = 1, attempts: int = 8
) -> socket.socket:
    """Bind and listen on host:port (port 0 or None: any free port). The launcher binds it itself, so there is no
    window in which another process could take the port between choosing and using it. `listeners` > 1: a
    ListenerGroup of that many sockets on one port (module docstring)."""
    addr = store_host(host)
    try:
        infos = socket.getaddrinfo(addr, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV)
    except OSError as exc:
        raise UsageError(f"--master-addr {host} does not resolve ({exc}); give an address of this machine.") from None
    family, _, _, _, sockaddr = infos[0]
    if listeners <= 1:
        sock = socket.socket(family, socket.SOCK_STREAM)
        _bind(sock, sockaddr, host, port, option)
        return sock
    if port:  # an explicit port: fail as one socket would if anything listens there (SO_REUSEPORT or not)
        # bound, never listening: a node's early connection cannot land in this probe's queue and be reset
        _bind(socket.socket(family, socket.SOCK_STREAM), sockaddr, host, port, option, listen=False).close()
    group = ListenerGroup(family, socket.SOCK_STREAM)
    group.siblings = []
    try:
        group.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        _bind(group, sockaddr, host, port, option)
        bound = group.getsockname()
        for _ in range(listeners - 1):
            sibling = socket.socket(family, socket.SOCK_STREAM)
            group.siblings.append(sibling)
            sibling.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            _bind(sibling, bound, host, port, option)
        seen = listeners_on(bound[0], int(bound[1]))
    except BaseException:
        group.close()
        raise
    # seen < listeners: the tables do not show the group itself (unreadable here), so they cannot show another
    # socket either; the kernel's rule (same user only) and, for an explicit port, the probe above still hold
    if seen > listeners:
        group.close()
        if not port and attempts > 1:  # the kernel gave us a port that someone else's group shares: take another
            return bind_store_socket(host, port, option, listeners=listeners, attempts=attempts - 1)
        taken = int(bound[1])
        raise UsageError(
            f"{option} {port or taken}: another program listens on port {taken} too{_who_listens(taken)}. Choose "
            f"another port, or leave {option} out: ddpboot then binds a free port itself."
        )
    return group


def _bind(
    sock: socket.socket, sockaddr: tuple[Any, ...], host: str, port: int | None, option: str, *, listen: bool = True
) -> socket.socket:
    addr = sockaddr[0]
    try:
        if port:
            # Reuse a port in TIME_WAIT from an earlier run; a port something listens on still fails below.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        if listen:
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"{option} {port}: port {port} on {addr} is in use{_who_listens(port or 0)}. Choose another port, "
                f"or leave {option} out: ddpboot then binds a free port itself."
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(
                f"--master-addr {host} ({addr}) is not an address of this machine, and a one-node job serves "
                "its store here. Leave --master-addr out (the store then listens on loopback only)."
            ) from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"{option} {port}: binding port {port} needs privileges; use a port above 1023.") from None
        raise
    return sock


def listeners_on(addr: str, port: int) -> int:
    """Listening TCP sockets in this network namespace on `port`, at `addr` or the wildcard address
    (/proc/net/tcp and tcp6); 0 where neither table can be read."""
    mine = plain_address(addr)
    count = 0
    for table in TCP_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != TCP_LISTEN:
                continue
            address, their_port = proc_address(fields[1])
            if their_port != port:
                continue
            theirs = plain_address(address)
            if theirs is not None and (theirs == mine or theirs.is_unspecified):
                count += 1
    return count


def _who_listens(port: int) -> str:
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                name = psutil.Process(conn.pid).name()
                return f" (pid {conn.pid}, {name})"
    except Exception:  # psutil may need privileges to see other users' sockets: the port is enough
        pass
    return ""
