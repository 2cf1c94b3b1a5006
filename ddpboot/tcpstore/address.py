"""Where a store listens: loopback names, and the listening socket bound once by whoever serves the store.

The launcher binds the socket itself (port 0: any free port) and hands it to the store's server, so no other
process can take the port between choosing and using it; the listen backlog leaves room for every rank at once.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from ddpboot.errors import UsageError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")

LISTEN_BACKLOG = 65535
"""Connections the kernel queues before the store accepts them; it caps this at net.core.somaxconn (4096 by default
on current kernels). Every rank connects at once at the start: past the queue, a client's SYN is dropped and retried
a second later, so a small queue costs a large job whole seconds."""


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_store_socket(host: str, port: int | None, option: str = "--master-port") -> socket.socket:
    """Bind and listen on host:port (port 0 or None: any free port). The launcher binds it itself, so there is no
    window in which another process could take the port between choosing and using it."""
    loop = is_loopback(host)
    addr = "127.0.0.1" if loop else host
    try:
        infos = socket.getaddrinfo(addr, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV)
    except OSError as exc:
        raise UsageError(f"--master-addr {host} does not resolve ({exc}); give an address of this machine.") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if port:
            # Reuse a port in TIME_WAIT from an earlier run; a port something listens on still fails below.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
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
                f"--master-addr {host} ({sockaddr[0]}) is not an address of this machine, and a one-node job serves "
                "its store here. Leave --master-addr out (the store then listens on loopback only)."
            ) from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"{option} {port}: binding port {port} needs privileges; use a port above 1023.") from None
        raise
    return sock


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
