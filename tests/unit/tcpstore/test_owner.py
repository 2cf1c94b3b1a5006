"""Who may use a store (ddpboot.tcpstore.owner): loopback peers are judged by their socket's uid, a closed client's
timewait record (uid 0) is never taken for root, and a refusal is described once per uid."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.tcpstore.owner import (
    Allow,
    OwnerGate,
    Verdict,
    describe_allowed,
    is_loopback_peer,
    judge,
    pid_of_socket,
    refusal_message,
    resolve_allowed_uids,
    tables_unusable,
)
from ddpboot.tcpstore.peer import ESTABLISHED, FIN_WAIT1, FIN_WAIT2, TIME_WAIT, SocketEntry, SocketTables

ENDS = (("127.0.0.1", 40000), ("127.0.0.1", 29500))


def entry(uid: int, state: int = ESTABLISHED, inode: int = 7) -> SocketEntry:
    return SocketEntry(*ENDS, state=state, uid=uid, inode=inode)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True), ("::FFFF:127.9.9.9", True),
     ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False), ("192.0.2.2", False), ("name", False)],
)
def test_loopback_peers(address: str, loopback: bool) -> None:
    assert is_loopback_peer(address) is loopback


def test_the_default_is_the_servers_own_uid_and_root() -> None:
    assert resolve_allowed_uids(Allow.OWNER_AND_ROOT) == frozenset({os.getuid(), 0})
    assert resolve_allowed_uids(None) is None
    assert resolve_allowed_uids(frozenset({5})) == frozenset({5})


def test_allowed_uids_are_admitted_and_others_refused() -> None:
    allowed = frozenset({1000, 0})
    assert judge(entry(1000), allowed) == Verdict(allowed=True, uid=1000, inode=7)
    assert judge(entry(0), allowed).allowed
    assert judge(entry(0, state=FIN_WAIT1), allowed).allowed  # a closing socket is still whole
    assert judge(entry(65534), allowed) == Verdict(allowed=False, uid=65534, inode=7)


def test_a_client_that_is_gone_is_refused() -> None:
    allowed = frozenset({1000, 0})
    assert judge(None, allowed) == Verdict(allowed=False, uid=None)
    # After close the kernel keeps a timewait record that reports uid 0 whoever owned the socket.
    assert judge(entry(0, state=FIN_WAIT2, inode=0), allowed) == Verdict(allowed=False, uid=None)
    assert judge(entry(0, state=TIME_WAIT, inode=0), allowed) == Verdict(allowed=False, uid=None)


def test_what_the_allowed_set_reads_as() -> None:
    assert describe_allowed(frozenset({0}), 0) == "only the job's owner (uid 0) may use its store"
    assert describe_allowed(frozenset({1000, 0}), 1000) == "only the job's owner (uid 1000) and root may use its store"
    assert describe_allowed(frozenset({1000, 7}), 1000) == "only the job's owner (uid 1000) and uid 7 may use its store"
    assert describe_allowed(frozenset({7, 8}), 1000) == "only uid 7, 8 may use its store"


def test_refusal_messages() -> None:
    nobody = refusal_message(Verdict(False, 65534), ENDS[0], frozenset({os.getuid(), 0}), pid=4242)
    assert nobody.startswith("refused a connection from uid 65534 (nobody, pid 4242): only the job's owner (uid ")
    unnamed = refusal_message(Verdict(False, 2_000_000_000), ENDS[0], frozenset({0}))
    assert unnamed.startswith("refused a connection from uid 2000000000: only")
    gone = refusal_message(Verdict(False, None), ENDS[0], frozenset({0}))
    assert gone.startswith("refused a connection from 127.0.0.1 port 40000: its socket is no longer")


def test_the_pid_is_found_only_as_root() -> None:
    with socket.socket() as sock:
        found = pid_of_socket(os.fstat(sock.fileno()).st_ino)
    assert found == (os.getpid() if os.geteuid() == 0 else None)
    assert pid_of_socket(0) is None


def test_the_gate_reports_each_refused_uid_once(connection: tuple[socket.socket, socket.socket]) -> None:
    warnings: list[str] = []
    gate = OwnerGate(frozenset({os.getuid() + 1}), warnings.append)
    try:
        assert not gate.admit(connection[1])
        assert not gate.admit(connection[1])
    finally:
        gate.close()
    assert len(warnings) == 1 and warnings[0].startswith(f"refused a connection from uid {os.getuid()} ")
    own = OwnerGate(frozenset({os.getuid()}), warnings.append)
    assert own.admit(connection[1])
    own.close()


def test_without_any_socket_table_every_local_connection_is_refused_with_one_warning(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    """Fail closed: where neither netlink nor /proc/net can be read, even the owner's own connection is refused."""
    warnings: list[str] = []
    tables = SocketTables(proc_net=Path("/nonexistent"))
    tables.netlink_broken = True
    gate = OwnerGate(frozenset({os.getuid()}), warnings.append, tables)
    assert gate.admit(connection[1]) is False and gate.admit(connection[1]) is False
    assert len(warnings) == 1 and "refusing every local connection" in warnings[0], warnings
    assert tables_unusable(tables) is not None
    assert tables_unusable() is None  # this machine's tables can be read


@contextlib.contextmanager
def no_free_descriptor() -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE lowered to its lowest free descriptor number: the next socket() or open()
    fails with EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_lookup_without_a_free_descriptor_decides_nothing_and_breaks_nothing(
    connection: tuple[socket.socket, socket.socket],
) -> None:
    """A real EMFILE while the netlink socket must be opened again: the connection is neither served nor refused
    (None: held), netlink is not given up, and once a descriptor is free the same connection is judged."""
    warnings: list[str] = []
    gate = OwnerGate(frozenset({os.getuid()}), warnings.append)
    gate.tables.close()  # its netlink socket must now be opened again
    try:
        with no_free_descriptor():
            assert gate.admit(connection[1]) is None
        assert not gate.tables.netlink_broken
        assert gate.admit(connection[1]) is True and gate.tables.netlink is not None
    finally:
        gate.close()
    assert len(warnings) == 1 and "Too many open files" in warnings[0] and "wait, unread" in warnings[0], warnings


def test_a_burst_is_judged_socket_by_socket(connection: tuple[socket.socket, socket.socket]) -> None:
    """admit_many: the owner's connection in, a socket already reset by its client out, in their places."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    gone = socket.create_connection(listener.getsockname())
    gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends a reset
    accepted_gone, _ = listener.accept()
    gone.close()
    warnings: list[str] = []
    gate = OwnerGate(frozenset({os.getuid()}), warnings.append)
    try:
        assert gate.admit_many([connection[1], accepted_gone, connection[1]]) == [True, False, True]
        assert gate.admit_many([]) == []
    finally:
        gate.close()
        accepted_gone.close()
        listener.close()
