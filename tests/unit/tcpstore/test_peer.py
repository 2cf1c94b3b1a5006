"""Finding a TCP socket's owner in the kernel's tables (ddpboot.tcpstore.peer): the /proc/net/tcp{,6} text and the
sock_diag netlink bytes, parsed from captures of a real kernel (a client of uid 65534 on 127.0.0.1 port 55162 to
a server on port 57589; a root client on ::1), and the lookup itself on live sockets."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.tcpstore.peer import (
    ESTABLISHED,
    FIN_WAIT2,
    NETLINK_BATCH,
    NETLINK_SOCK_DIAG,
    TIME_WAIT,
    Endpoint,
    SocketEntry,
    SocketTables,
    TablesUnavailable,
    diag_request,
    find_in_proc_table,
    parse_diag_reply,
    parse_proc_line,
    proc_address,
    proc_families,
    proc_field,
    unmapped,
)

PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A4BF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99459 1 00000000cfddbcec 100 0 0 10 0
  24: 0100007F:D77A 0100007F:E0F5 01 00000000:00000000 00:00000000 00000000 65534        0 355587 2 000000009d923ed5 20 0 0 10 -1
  30: 0100007F:E0F5 0100007F:D77A 01 00000000:00000000 00:00000000 00000000     0        0 356364 1 000000000be44ec2 20 0 0 10 -1
"""  # noqa: E501
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:940A 0000000000000000FFFF00000100007F:C7D3 06 00000000:00000000 03:00001460 00000000     0        0 0 3 00000000e9793bf0
   1: 00000000000000000000000001000000:85BC 00000000000000000000000001000000:843B 01 00000000:00000000 00:00000000 00000000     0        0 356369 2 000000009efe8bdb 20 0 0 10 -1
"""  # noqa: E501

# The kernel's answer (with its trailing attributes) for the uid 65534 client above, and for the ::1 client.
DIAG_NOBODY = bytes.fromhex(
    "7c0000001400000007000000867e000002010000d77ae0f57f00000100000000000000000000"
    "00007f00000100000000000000000000000000000000d57d0000000000000000000000000000"
    "00000000feff0000036d0500050008000000000008000f00000000000c001500010000000000"
    "00000600160052000000"
)
DIAG_IPV6 = bytes.fromhex(
    "7c0000001400000009000000867e00000a01000085bc843b0000000000000000000000000000"
    "00010000000000000000000000000000000100000000d67d0000000000000000000000000000"
    "000000000000000011700500050008000000000008000f00000000000c001500010000000000"
    "00000600160012000000"
)
# "No such socket": an NLMSG_ERROR carrying -ENOENT and the request it answers.
DIAG_MISSING = bytes.fromhex(
    "5c0000000200000008000000607e0000feffffff4800000014000100080000000000000002060000"
    "ffffffff0001bc2b7f0000010000000000000000000000007f000001000000000000000000000000"
    "00000000ffffffffffffffff"
)


# --- /proc/net/tcp{,6} ----------------------------------------------------------------------------------------------


def test_proc_addresses_are_host_order_words() -> None:
    assert proc_address("0100007F:D77A") == ("127.0.0.1", 55162)
    assert proc_address("00000000000000000000000001000000:85BC") == ("::1", 34236)
    assert proc_address("0000000000000000FFFF00000100007F:940A") == ("::ffff:127.0.0.1", 37898)


def test_proc_fields_round_trip_and_map_ipv4_into_tcp6() -> None:
    assert proc_field(("127.0.0.1", 55162), socket.AF_INET) == "0100007F:D77A"
    assert proc_field(("127.0.0.1", 37898), socket.AF_INET6) == "0000000000000000FFFF00000100007F:940A"
    assert proc_field(("::ffff:127.0.0.1", 55162), socket.AF_INET) == "0100007F:D77A"
    assert proc_field(("::1", 34236), socket.AF_INET6) == "00000000000000000000000001000000:85BC"


def test_a_proc_line_gives_state_uid_and_inode() -> None:
    line = PROC_TCP.splitlines()[2]
    assert parse_proc_line(line) == SocketEntry(("127.0.0.1", 55162), ("127.0.0.1", 57589), ESTABLISHED, 65534, 355587)


def test_the_client_side_is_found_not_the_servers() -> None:
    client = find_in_proc_table(PROC_TCP, socket.AF_INET, ("127.0.0.1", 55162), ("127.0.0.1", 57589))
    assert client is not None and client.uid == 65534 and client.inode == 355587
    server = find_in_proc_table(PROC_TCP, socket.AF_INET, ("127.0.0.1", 57589), ("127.0.0.1", 55162))
    assert server is not None and server.uid == 0
    assert find_in_proc_table(PROC_TCP, socket.AF_INET, ("127.0.0.1", 55163), ("127.0.0.1", 57589)) is None
    ipv6 = find_in_proc_table(PROC_TCP6, socket.AF_INET6, ("::1", 34236), ("::1", 33851))
    assert ipv6 is not None and ipv6.inode == 356369


def test_a_timewait_record_says_uid_0_and_is_not_an_owner() -> None:
    mapped = find_in_proc_table(PROC_TCP6, socket.AF_INET6, ("127.0.0.1", 37898), ("127.0.0.1", 51155))
    assert mapped is not None and mapped.state == TIME_WAIT and mapped.uid == 0 and mapped.inode == 0
    assert not mapped.owner_known
    assert not SocketEntry(("127.0.0.1", 1), ("127.0.0.1", 2), FIN_WAIT2, 0, 0).owner_known
    assert SocketEntry(("127.0.0.1", 1), ("127.0.0.1", 2), ESTABLISHED, 0, 5).owner_known


def test_ipv4_clients_are_looked_for_in_both_tables() -> None:
    assert proc_families(("127.0.0.1", 1)) == (socket.AF_INET, socket.AF_INET6)
    assert proc_families(("::ffff:127.0.0.1", 1)) == (socket.AF_INET, socket.AF_INET6)
    assert proc_families(("::1", 1)) == (socket.AF_INET6,)
    assert unmapped("::FFFF:127.0.0.2") == "127.0.0.2" and unmapped("::1") == "::1"


# --- sock_diag netlink ----------------------------------------------------------------------------------------------


def test_the_request_names_the_exact_four_tuple() -> None:
    req = diag_request(("127.0.0.1", 55162), ("::ffff:127.0.0.1", 57589), 7)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", req)
    assert (length, kind, flags, seq) == (len(req), 20, 1, 7) and len(req) == 72
    family, protocol = req[16], req[17]
    assert (family, protocol) == (socket.AF_INET, socket.IPPROTO_TCP)
    sport, dport = struct.unpack_from("!HH", req, 24)
    assert (sport, dport) == (55162, 57589)
    assert req[28:32] == socket.inet_aton("127.0.0.1") and req[44:48] == socket.inet_aton("127.0.0.1")
    assert req[64:72] == b"\xff" * 8  # no cookie: match by addresses
    assert diag_request(("::1", 1), ("::1", 2), 1)[16] == socket.AF_INET6


def test_a_reply_gives_the_uid_of_the_socket() -> None:
    [(seq, entry)] = list(parse_diag_reply(DIAG_NOBODY))
    assert seq == 7
    assert entry == SocketEntry(("127.0.0.1", 55162), ("127.0.0.1", 57589), ESTABLISHED, 65534, 355587)
    [(_, ipv6)] = list(parse_diag_reply(DIAG_IPV6))
    assert ipv6 is not None and ipv6.local == ("::1", 34236) and ipv6.remote == ("::1", 33851) and ipv6.uid == 0


def test_no_such_socket_is_none_and_other_errors_raise() -> None:
    assert list(parse_diag_reply(DIAG_MISSING)) == [(8, None)]
    refused = DIAG_MISSING[:16] + struct.pack("=i", -errno.EPERM) + DIAG_MISSING[20:]
    with pytest.raises(OSError) as info:
        list(parse_diag_reply(refused))
    assert info.value.errno == errno.EPERM


# --- live lookups ---------------------------------------------------------------------------------------------------


def _ends(accepted: socket.socket) -> tuple[tuple[str, int], tuple[str, int]]:
    return accepted.getpeername()[:2], accepted.getsockname()[:2]


def test_netlink_and_proc_find_our_own_client(connection: tuple[socket.socket, socket.socket]) -> None:
    client, accepted = connection
    peer, own = _ends(accepted)
    tables = SocketTables()
    try:
        for entry in (tables.find_by_netlink(peer, own), tables.find_in_proc(peer, own)):
            assert entry is not None
            assert (entry.local, entry.remote, entry.state, entry.uid) == (peer, own, ESTABLISHED, os.getuid())
            assert entry.inode == os.fstat(client.fileno()).st_ino
        assert tables.find_by_netlink(own, (peer[0], 1)) is None  # the accepted end's address, a wrong peer
    finally:
        tables.close()


def test_without_netlink_the_proc_tables_answer(
    connection: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_netlink(*args: object) -> socket.socket:
        raise PermissionError(errno.EPERM, "no netlink here")

    peer, own = _ends(connection[1])
    tables = SocketTables()
    monkeypatch.setattr("socket.socket", no_netlink)
    entry = tables.find(peer, own)
    assert entry is not None and entry.uid == os.getuid() and tables.netlink_broken


def test_without_proc_and_netlink_the_tables_are_unavailable(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    peer, own = _ends(connection[1])
    tables = SocketTables(proc_net=Path("/nonexistent"))
    tables.netlink_broken = True
    with pytest.raises(TablesUnavailable):
        tables.find(peer, own)


@contextlib.contextmanager
def burst(count: int) -> Iterator[tuple[list[tuple[Endpoint, Endpoint]], list[int]]]:
    """`count` live loopback connections: each accepted socket's (peer, own) pair, and each client socket's inode."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(count)]
    accepted = [listener.accept()[0] for _ in clients]
    try:
        yield [_ends(a) for a in accepted], [os.fstat(c.fileno()).st_ino for c in clients]
    finally:
        for s in (*clients, *accepted, listener):
            s.close()


def test_a_burst_of_connections_is_looked_up_in_batches_in_order() -> None:
    """More connections than one netlink datagram carries: every answer lands at its own pair's place, and a pair
    with no socket (a wrong peer) is None between found ones."""
    tables = SocketTables()
    with burst(3 * NETLINK_BATCH + 5) as (pairs, inodes), contextlib.closing(tables):
        missing = 2 * NETLINK_BATCH + 1
        pairs[missing] = (pairs[missing][0], (pairs[missing][1][0], 1))  # a peer that does not exist
        found = tables.find_many(pairs)
    assert found[missing] is None and not tables.netlink_broken
    for index, (entry, (peer, own)) in enumerate(zip(found, pairs, strict=True)):
        if index != missing:
            assert entry is not None, index
            assert (entry.local, entry.remote, entry.uid, entry.inode) == (peer, own, os.getuid(), inodes[index])


def test_answers_the_receive_buffer_cannot_hold_are_asked_again_in_smaller_batches() -> None:
    """A netlink socket whose receive buffer holds only a few answers (as a smaller default or a larger kernel
    answer would make it): the kernel drops the rest of each datagram's answers (ENOBUFS); the lookup asks for those
    again in smaller datagrams and finds every socket, still over netlink."""
    tables = SocketTables()
    with burst(2 * NETLINK_BATCH) as (pairs, inodes), contextlib.closing(tables):
        tables.netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        tables.netlink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel doubles it: 8 KiB
        tables.netlink.settimeout(1.0)
        found = tables.find_many(pairs)
    assert not tables.netlink_broken and tables.batch < NETLINK_BATCH
    assert [e.inode if e else None for e in found] == inodes


def test_the_proc_tables_answer_a_burst_in_order() -> None:
    """The /proc fallback reads each table once for a whole batch and still puts each socket in its pair's place."""
    tables = SocketTables()
    with burst(40) as (pairs, inodes), contextlib.closing(tables):
        pairs[7] = (pairs[7][0], (pairs[7][1][0], 1))  # a peer that does not exist
        found = tables.find_many_in_proc(pairs)
    assert [e.inode if e else None for e in found] == [None if i == 7 else n for i, n in enumerate(inodes)]
