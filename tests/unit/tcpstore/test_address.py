"""Where the store listens (ddpboot.tcpstore.address): one socket, or a SO_REUSEPORT group of sockets on one port
whose queues the kernel spreads a burst of connections over, and the same refusal as one socket's when anything
else listens on the port asked for. Real sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from ddpboot.errors import UsageError
from ddpboot.tcpstore.address import (
    ListenerGroup,
    bind_store_socket,
    listeners_on,
    listening_sockets,
    store_host,
)


def test_one_listener_is_a_plain_socket() -> None:
    sock = bind_store_socket("127.0.0.1", None)
    try:
        assert not isinstance(sock, ListenerGroup)
        assert listening_sockets(sock) == [sock]
        assert listeners_on("127.0.0.1", sock.getsockname()[1]) == 1
    finally:
        sock.close()


def test_a_group_listens_on_one_port_and_closes_as_one() -> None:
    group = bind_store_socket("localhost", None, listeners=4)
    port = group.getsockname()[1]
    members = listening_sockets(group)
    assert len(members) == 4 and len({s.fileno() for s in members}) == 4
    assert {s.getsockname() for s in members} == {("127.0.0.1", port)}
    assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in members)
    assert listeners_on("127.0.0.1", port) == 4
    group.close()
    assert all(s.fileno() == -1 for s in members)
    assert listeners_on("127.0.0.1", port) == 0


def test_the_kernel_spreads_a_burst_over_the_groups_queues() -> None:
    group = bind_store_socket("127.0.0.1", None, listeners=4)
    clients = [socket.create_connection(group.getsockname()) for _ in range(64)]  # queued by the kernel, unaccepted
    try:
        per_queue = []
        for member in listening_sockets(group):
            member.setblocking(False)
            taken = 0
            while True:
                try:
                    conn, _ = member.accept()
                except BlockingIOError:
                    break
                conn.close()
                taken += 1
            per_queue.append(taken)
        assert sum(per_queue) == len(clients)
        assert sum(1 for n in per_queue if n) >= 2, per_queue  # 64 connections all on one queue of 4: (1/4)^63
    finally:
        for client in clients:
            client.close()
        group.close()


@pytest.mark.parametrize("reuseport", [False, True])
def test_a_port_anything_listens_on_is_refused_as_with_one_socket(reuseport: bool) -> None:
    other = socket.socket()
    if reuseport:  # a program of the same user that would let a group join it
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]
    try:
        for listeners in (1, 4):
            with pytest.raises(UsageError, match=f"--master-port {port}: port {port} on 127.0.0.1 is in use"):
                bind_store_socket("127.0.0.1", port, listeners=listeners)
        assert listeners_on("127.0.0.1", port) == 1  # nothing of ours was left listening
    finally:
        other.close()


def test_an_explicit_port_takes_a_group_once_free() -> None:
    probe = bind_store_socket("127.0.0.1", None)
    port = probe.getsockname()[1]
    probe.close()
    group = bind_store_socket("127.0.0.1", port, listeners=3)
    try:
        assert group.getsockname()[1] == port and len(listening_sockets(group)) == 3
    finally:
        group.close()


@contextlib.contextmanager
def a_program_joins_the_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[socket.socket]]:
    """Another program of the same user joins the group's port with SO_REUSEPORT after the group binds and before
    the launcher's check of the port: a real socket, made just before the first real count of listeners."""
    joined: list[socket.socket] = []

    def join_then_count(addr: str, port: int) -> int:
        if not joined:
            other = socket.socket()
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            other.bind((addr, port))
            other.listen()
            joined.append(other)
        return listeners_on(addr, port)

    monkeypatch.setattr("ddpboot.tcpstore.address.listeners_on", join_then_count)
    try:
        yield joined
    finally:
        for sock in joined:
            sock.close()


def test_a_port_another_program_joined_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = bind_store_socket("127.0.0.1", None)
    port = probe.getsockname()[1]
    probe.close()
    with a_program_joins_the_group(monkeypatch) as joined:
        with pytest.raises(UsageError, match=f"--master-port {port}: another program listens on port {port} too"):
            bind_store_socket("127.0.0.1", port, listeners=3)
        assert len(joined) == 1 and listeners_on("127.0.0.1", port) == 1  # only the other program's socket


def test_a_free_port_another_program_joined_is_traded_for_another(monkeypatch: pytest.MonkeyPatch) -> None:
    with a_program_joins_the_group(monkeypatch) as joined:
        group = bind_store_socket("127.0.0.1", None, listeners=3)
        try:
            taken = joined[0].getsockname()[1]
            port = group.getsockname()[1]
            assert port != taken and len(listening_sockets(group)) == 3
            assert listeners_on("127.0.0.1", port) == 3 and listeners_on("127.0.0.1", taken) == 1
        finally:
            group.close()


def test_listeners_are_counted_by_address_and_wildcard() -> None:
    """/proc/net/tcp holds addresses as host-order words: 127.0.0.2 must not be read as 2.0.0.127 or 127.0.0.1."""
    wildcard = socket.socket()
    wildcard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    wildcard.bind(("0.0.0.0", 0))
    wildcard.listen()
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.listen()
    try:
        port = wildcard.getsockname()[1]
        assert listeners_on("127.0.0.1", port) == 1  # 0.0.0.0 takes 127.0.0.1's connections too
        alone = other.getsockname()[1]
        assert listeners_on("127.0.0.2", alone) == 1
        assert listeners_on("127.0.0.1", alone) == 0
    finally:
        wildcard.close()
        other.close()


def test_a_loopback_name_is_127_0_0_1_and_a_loopback_address_is_itself() -> None:
    """A node named 127.0.0.2 (a test's host) serves its store there, where the other nodes connect."""
    assert [store_host(h) for h in ("localhost", "LOCALHOST", "127.0.0.2", "::1", "gpu01")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.2", "::1", "gpu01"]
    sock = bind_store_socket("127.0.0.2", None)
    try:
        assert sock.getsockname()[0] == "127.0.0.2"
    finally:
        sock.close()
