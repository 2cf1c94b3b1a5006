"""Who owns the other end of a local TCP connection, from the kernel's socket tables.

The client's socket is the table entry whose local address:port is the accepted socket's peer and whose remote
address:port is the accepted socket's own address. Two ways to find it:

- sock_diag netlink (NETLINK_SOCK_DIAG, an inet_diag_req_v2 without NLM_F_DUMP): the kernel looks the 4-tuple up
  in its connection hash and answers one inet_diag_msg, in constant time however many sockets the host has;
- /proc/net/tcp and /proc/net/tcp6: the kernel prints every socket of the network namespace as text, which this
  module searches; the cost grows with the number of sockets (docs/security.md has the measurements).

Netlink is asked first; where it cannot be opened or answers with an error other than "no such socket" (some
sandboxes), the /proc tables are read instead, for good. A full receive buffer (ENOBUFS: more answers to one datagram
than the socket holds) is not such an error: the answers that were dropped are asked again in smaller datagrams. Nor
is a failure that says nothing about netlink itself (no free file descriptor, no kernel memory: TRANSIENT): that
lookup raises LookupFailed, and the next one asks netlink again. Both ways report the uid that created the socket.
Where neither can be read, TablesUnavailable says so (owner.py then decides).

After a client closes, the kernel may replace its socket by a small "timewait" record (states FIN_WAIT2 and
TIME_WAIT) that reports uid 0 and inode 0 whoever owned the socket: `SocketEntry.owner_known` is False for those
states, so that a closed client is never taken for root.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

Endpoint = tuple[str, int]  # (numeric address, port)

# TCP states as the kernel numbers them (include/net/tcp_states.h).
ESTABLISHED, SYN_SENT, SYN_RECV, FIN_WAIT1, FIN_WAIT2, TIME_WAIT = 1, 2, 3, 4, 5, 6

# Netlink and inet_diag (include/uapi/linux/netlink.h, sock_diag.h, inet_diag.h).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
NLMSG_ERRNO = struct.Struct("=i")
DIAG_REQUEST = struct.Struct("=BBBxI")  # family, protocol, extensions, states (then the socket id)
DIAG_MESSAGE = struct.Struct("=BBBB")  # family, state, timer, retransmits (then the socket id)
SOCKET_ID = struct.Struct("!HH16s16s")  # source port, destination port, source, destination (network order)
SOCKET_ID_TAIL = struct.Struct("=III")  # interface, cookie (two words)
DIAG_COUNTERS = struct.Struct("=IIIII")  # expires, receive queue, send queue, uid, inode
NO_COOKIE = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE: match the socket by its addresses only
ALL_STATES = 0xFFFFFFFF
NETLINK_TIMEOUT = 1.0  # seconds; the kernel answers in microseconds, so a silent netlink socket is broken
# Requests sent in one datagram: their answers (1.1-1.6 KiB each as the kernel accounts them) must fit the netlink
# socket's receive buffer (208 KiB by default: 128 answers fit on Linux 6.18, 192 do not). Where some are dropped
# (ENOBUFS), SocketTables halves its batch and asks for those again.
NETLINK_BATCH = 64

_WORD = struct.Struct("=I")  # /proc/net/tcp* print each 32-bit word of an address as the host reads it
# Errors that say the process (or the machine) lacks a resource for now, not that a table is missing here.
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EAGAIN, errno.EINTR})


class TablesUnavailable(OSError):
    """Neither sock_diag netlink nor /proc/net/tcp{,6} can be read here: no socket's owner can be known."""


class LookupFailed(OSError):
    """The tables could not be read just now (TRANSIENT: e.g. no free file descriptor); a later lookup may work."""


@dataclass(frozen=True)
class SocketEntry:
    """One TCP socket of the kernel's tables, as seen from its own side."""

    local: Endpoint
    remote: Endpoint
    state: int
    uid: int
    inode: int

    @property
    def owner_known(self) -> bool:
        """Whether `uid` is the socket's owner: False for the timewait records of closed sockets (uid 0)."""
        return self.state not in (FIN_WAIT2, TIME_WAIT)


def unmapped(address: str) -> str:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it stands for; others unchanged."""
    if address.lower().startswith("::ffff:") and "." in address:
        return address[7:]
    return address


def _packed(address: str) -> tuple[int, bytes]:
    """(family, bytes) of a numeric address."""
    if ":" in address:
        return socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address.split("%")[0])
    return socket.AF_INET, socket.inet_pton(socket.AF_INET, address)


def _same(a: Endpoint, b: Endpoint) -> bool:
    return a[1] == b[1] and unmapped(a[0]) == unmapped(b[0])


# --- /proc/net/tcp and tcp6 ----------------------------------------------------------------------------------------


def proc_address(field: str) -> Endpoint:
    """An `ADDRESS:PORT` field of /proc/net/tcp{,6} (hex, the address in host-order 32-bit words)."""
    host, port = field.split(":")
    raw = b"".join(_WORD.pack(int(host[i : i + 8], 16)) for i in range(0, len(host), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


def proc_field(endpoint: Endpoint, family: int) -> str:
    """How /proc/net/tcp (AF_INET) or tcp6 (AF_INET6: IPv4 as mapped addresses) prints `endpoint`."""
    address = unmapped(endpoint[0])
    if family == socket.AF_INET6 and ":" not in address:
        address = "::ffff:" + address
    raw = _packed(address)[1]
    words = "".join(f"{_WORD.unpack(raw[i : i + 4])[0]:08X}" for i in range(0, len(raw), 4))
    return f"{words}:{endpoint[1]:04X}"


def parse_proc_line(line: str) -> SocketEntry:
    """One socket line of /proc/net/tcp{,6}: `sl local remote st queues timer retransmits uid timeout inode ...`."""
    fields = line.split()
    return SocketEntry(
        local=proc_address(fields[1]),
        remote=proc_address(fields[2]),
        state=int(fields[3], 16),
        uid=int(fields[7]),
        inode=int(fields[9]),
    )


def find_in_proc_table(table: str, family: int, local: Endpoint, remote: Endpoint) -> SocketEntry | None:
    """The socket of `table` (the text of /proc/net/tcp for AF_INET, tcp6 for AF_INET6) with these endpoints."""
    needle = f" {proc_field(local, family)} {proc_field(remote, family)} "
    at = table.find(needle)
    if at < 0:
        return None
    start = table.rfind("\n", 0, at) + 1
    end = table.find("\n", at)
    return parse_proc_line(table[start : end if end >= 0 else len(table)])


def proc_families(local: Endpoint) -> tuple[int, ...]:
    """The tables a client at `local` can be in: an IPv4 client is an AF_INET socket (tcp) or an IPv6 socket
    connected to a mapped address (tcp6); an IPv6 client is in tcp6 only."""
    if ":" in unmapped(local[0]):
        return (socket.AF_INET6,)
    return (socket.AF_INET, socket.AF_INET6)


# --- sock_diag netlink ---------------------------------------------------------------------------------------------


def diag_request(local: Endpoint, remote: Endpoint, sequence: int) -> bytes:
    """A SOCK_DIAG_BY_FAMILY request for the one TCP socket whose own side is `local` and other side `remote`.
    IPv4 (and IPv4-mapped) endpoints are asked as AF_INET: the kernel's IPv4 lookup also finds an IPv6 socket
    connected to a mapped address."""
    family, src = _packed(unmapped(local[0]))
    _, dst = _packed(unmapped(remote[0]))
    sockid = SOCKET_ID.pack(local[1], remote[1], src.ljust(16, b"\0"), dst.ljust(16, b"\0"))
    body = (
        DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, ALL_STATES)
        + sockid
        + SOCKET_ID_TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    )
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, sequence, 0) + body


def _diag_endpoints(family: int, sockid: bytes) -> tuple[Endpoint, Endpoint]:
    sport, dport, src, dst = SOCKET_ID.unpack(sockid[: SOCKET_ID.size])
    size = 4 if family == socket.AF_INET else 16
    return (socket.inet_ntop(family, src[:size]), sport), (socket.inet_ntop(family, dst[:size]), dport)


def parse_diag_message(payload: bytes) -> SocketEntry:
    """An inet_diag_msg: family, state, timer, retransmits, the socket id, then expires, queues, uid, inode."""
    family, state, _, _ = DIAG_MESSAGE.unpack_from(payload)
    at = DIAG_MESSAGE.size
    local, remote = _diag_endpoints(family, payload[at : at + SOCKET_ID.size + SOCKET_ID_TAIL.size])
    at += SOCKET_ID.size + SOCKET_ID_TAIL.size
    _, _, _, uid, inode = DIAG_COUNTERS.unpack_from(payload, at)
    return SocketEntry(local=local, remote=remote, state=state, uid=uid, inode=inode)


def parse_diag_reply(data: bytes) -> Iterator[tuple[int, SocketEntry | None]]:
    """(sequence, socket) for each message of a netlink reply; None for "no such socket" (ENOENT). Any other
    error the kernel sends is raised as OSError."""
    at = 0
    while at + NLMSG_HEADER.size <= len(data):
        length, kind, _, sequence, _ = NLMSG_HEADER.unpack_from(data, at)
        if length < NLMSG_HEADER.size:
            raise OSError(errno.EPROTO, "a netlink message shorter than its header")
        payload = data[at + NLMSG_HEADER.size : at + length]
        at += (length + 3) & ~3
        if kind == NLMSG_ERROR:
            code = -NLMSG_ERRNO.unpack_from(payload)[0]
            if code != errno.ENOENT:
                raise OSError(code, f"sock_diag: {errno.errorcode.get(code, code)}")
            yield sequence, None
        elif kind == SOCK_DIAG_BY_FAMILY:
            yield sequence, parse_diag_message(payload)


# --- the lookup ----------------------------------------------------------------------------------------------------


class SocketTables:
    """Finds a TCP socket of this network namespace by its endpoints: netlink while it works, else /proc."""

    def __init__(self, proc_net: Path = Path("/proc/net")) -> None:
        self.proc_net = proc_net
        self.netlink: socket.socket | None = None
        self.netlink_broken = False
        self.sequence = 0
        self.batch = NETLINK_BATCH  # halved each time the answers to one datagram overflow the receive buffer

    def find(self, local: Endpoint, remote: Endpoint) -> SocketEntry | None:
        """The socket whose own side is `local` and other side `remote`, or None when the kernel has none;
        TablesUnavailable when there is no table to look in."""
        return self.find_many([(local, remote)])[0]

    def find_many(self, pairs: Sequence[tuple[Endpoint, Endpoint]]) -> list[SocketEntry | None]:
        """`find` for each (local, remote) pair, in order: over netlink, one request message per pair and one send
        per `batch` pairs (NETLINK_BATCH, halved after a drop): a burst accepted together is judged in a few system
        calls."""
        if not self.netlink_broken:
            try:
                return self.find_many_by_netlink(pairs)
            except OSError as exc:
                if exc.errno in TRANSIENT:
                    raise LookupFailed(exc.errno, f"sock_diag netlink: {exc.strerror or exc}") from exc
                self.netlink_broken = True
                self.close()
        return self.find_many_in_proc(pairs)

    def open(self) -> None:
        """Open the netlink socket now, so that the file descriptor it needs is held from the start (a lookup
        under a full file table then still works); a netlink that cannot be opened here is given up for /proc."""
        if self.netlink is not None or self.netlink_broken:
            return
        try:
            self._netlink()
        except OSError as exc:
            if exc.errno not in TRANSIENT:
                self.netlink_broken = True

    def _netlink(self) -> socket.socket:
        if self.netlink is None:
            netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
            netlink.settimeout(NETLINK_TIMEOUT)
            self.netlink = netlink
        return self.netlink

    def find_by_netlink(self, local: Endpoint, remote: Endpoint) -> SocketEntry | None:
        return self.find_many_by_netlink([(local, remote)])[0]

    def find_many_by_netlink(self, pairs: Sequence[tuple[Endpoint, Endpoint]]) -> list[SocketEntry | None]:
        netlink = self._netlink()
        found: list[SocketEntry | None] = [None] * len(pairs)
        pending = list(range(len(pairs)))
        while pending:
            asked, pending = pending[: self.batch], pending[self.batch :]
            dropped = self._ask(netlink, pairs, asked, found)
            if dropped:
                if self.batch == 1:  # one answer does not fit: no batch size helps (not TRANSIENT: for good)
                    raise OSError(errno.EMSGSIZE, "sock_diag: one answer overflows the netlink receive buffer")
                self.batch = max(1, self.batch // 2)
                pending = dropped + pending
        return found

    def _ask(
        self,
        netlink: socket.socket,
        pairs: Sequence[tuple[Endpoint, Endpoint]],
        indexes: list[int],
        found: list[SocketEntry | None],
    ) -> list[int]:
        """Send one datagram asking for pairs[i] for each i of `indexes` and fill `found` from the answers. Returns
        the indexes whose answers the kernel dropped (ENOBUFS): it answers every request of a datagram while
        sendto runs, so once it reported a drop, what is not queued then will never come."""
        asked: dict[int, int] = {}  # sequence -> index in pairs
        messages = []
        for index in indexes:
            self.sequence = (self.sequence + 1) & 0xFFFFFFFF
            asked[self.sequence] = index
            messages.append(diag_request(*pairs[index], self.sequence))
        netlink.sendto(b"".join(messages), (0, 0))
        try:
            while asked:
                try:
                    data = netlink.recv(1 << 16)
                except BlockingIOError:  # after a drop: everything still queued has been read
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS or not netlink.gettimeout():
                        raise
                    netlink.setblocking(False)  # read what is queued, then stop
                    continue
                for sequence, entry in parse_diag_reply(data):
                    index = asked.pop(sequence, -1)
                    if index < 0:  # a late answer of an earlier request that timed out
                        continue
                    local, remote = pairs[index]
                    # Without an established match the kernel answers a listener on `local`: not the client.
                    if entry is not None and _same(entry.local, local) and _same(entry.remote, remote):
                        found[index] = entry
        finally:
            if netlink.gettimeout() != NETLINK_TIMEOUT:  # drained after a drop: blocking with a timeout again
                netlink.settimeout(NETLINK_TIMEOUT)
        return list(asked.values())

    def find_in_proc(self, local: Endpoint, remote: Endpoint) -> SocketEntry | None:
        return self.find_many_in_proc([(local, remote)])[0]

    def find_many_in_proc(self, pairs: Sequence[tuple[Endpoint, Endpoint]]) -> list[SocketEntry | None]:
        """`find` for each pair in /proc/net/tcp and tcp6, each table read once for them all."""
        tables: dict[int, str | None] = {}

        def table(family: int) -> str | None:
            if family not in tables:
                name = "tcp" if family == socket.AF_INET else "tcp6"
                try:
                    tables[family] = (self.proc_net / name).read_text()
                except OSError as exc:
                    if exc.errno in TRANSIENT:
                        raise LookupFailed(exc.errno, f"{self.proc_net / name}: {exc.strerror or exc}") from exc
                    tables[family] = None  # no IPv6 in this kernel, or no /proc
            return tables[family]

        found: list[SocketEntry | None] = []
        for local, remote in pairs:
            entry = None
            for family in proc_families(local):
                text = table(family)
                if text is not None and (entry := find_in_proc_table(text, family, local, remote)) is not None:
                    break
            found.append(entry)
        if tables and not any(text is not None for text in tables.values()):
            raise TablesUnavailable(f"cannot read {self.proc_net}/tcp or tcp6, and sock_diag netlink does not answer")
        return found

    def close(self) -> None:
        if self.netlink is not None:
            with contextlib.suppress(OSError):
                self.netlink.close()
            self.netlink = None
