"""How the store takes connections (ddpboot.tcpstore.intake), with real sockets and this process's real
RLIMIT_NOFILE lowered for the test: a batch never takes the descriptors kept for the owner check, a full table stops
watching the listen queue (no busy loop) until a connection closes, an accept() that fails with EMFILE all the same
does too, and a connection whose owner cannot be known yet is held and judged again."""

from __future__ import annotations

import contextlib
import resource
import select
import socket
from collections.abc import Iterator, Sequence

import pytest

from ddpboot.tcpstore.intake import JUDGE_RETRY, RESERVE, Intake, open_files, room
from tests.support import wait_for


def test_room_keeps_the_reserve() -> None:
    assert room(1024, 1000) == 1024 - 1000 - RESERVE
    assert room(1024, 1024 - RESERVE) == 0
    assert room(1024, 1024) == 0


def test_open_files_counts_this_processs_descriptors() -> None:
    before = open_files()
    with socket.socket():
        assert open_files() == before + 1


class Queue:
    """A listener with `count` clients waiting in its queue, and an Intake on it that serves what `verdicts` says
    (True, False or None for each socket it is asked about, in turn; True once the list is spent)."""

    def __init__(self, count: int, verdicts: Sequence[bool | None] = ()) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.clients = [socket.create_connection(self.listener.getsockname()) for _ in range(count)]
        self.poll = select.epoll()
        self.poll.register(self.listener.fileno(), select.EPOLLIN)
        self.verdicts = list(verdicts)
        self.asked = 0
        self.served: list[socket.socket] = []
        self.warnings: list[str] = []
        self.intake = Intake([self.listener], self.poll, self.admit, self.warnings.append, lambda: len(self.served))

    def admit(self, socks: list[socket.socket]) -> list[bool | None]:
        self.asked += len(socks)
        return [self.verdicts.pop(0) if self.verdicts else True for _ in socks]

    def take(self) -> list[socket.socket]:
        taken = self.intake.take()
        self.served += taken
        return taken

    def listener_watched(self) -> bool:
        return any(fd == self.listener.fileno() for fd, _ in self.poll.poll(0))

    def close(self) -> None:
        self.intake.close()
        for sock in (*self.served, *self.clients, self.listener):
            sock.close()
        self.poll.close()


@pytest.fixture
def queue() -> Iterator[type[Queue]]:
    made: list[Queue] = []

    class Made(Queue):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Made
    for q in made:
        q.close()


@contextlib.contextmanager
def file_limit(soft: int) -> Iterator[None]:
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def test_a_batch_leaves_the_reserve_free_and_a_full_table_stops_watching_the_queue(queue: type[Queue]) -> None:
    q = queue(10)
    with file_limit(q.intake.used() + RESERVE + 4):
        assert len(q.take()) == 4  # 6 still wait in the queue
        assert not q.intake.watching and not q.listener_watched()  # a ready queue it cannot take from: not watched
        assert len(q.warnings) == 1 and "open-file table is full" in q.warnings[0], q.warnings
        assert q.take() == []
        q.served.pop().close()  # a connection closes: room for one more
        q.intake.room_freed()
        assert q.intake.watching and q.listener_watched()
        assert len(q.take()) == 1 and not q.intake.watching
    assert len(q.warnings) == 1


def test_an_accept_that_fails_with_emfile_stops_watching_too(queue: type[Queue]) -> None:
    """Files the intake does not know of fill the table: accept() fails (EMFILE); the queue is no longer watched,
    so the loop does not wake for it again and again, and the files are counted again."""
    q = queue(3)
    limit = q.intake.used() + RESERVE + 2
    with file_limit(limit):
        others = []
        with contextlib.suppress(OSError):
            while True:
                others.append(socket.socket())
        try:
            assert q.take() == []
            assert not q.intake.watching and not q.listener_watched()
            assert "Too many open files" in q.warnings[0], q.warnings
            assert q.intake.used() == limit
        finally:
            for sock in others:
                sock.close()


def test_a_connection_whose_owner_is_not_known_yet_is_held_then_judged_again(queue: type[Queue]) -> None:
    q = queue(2, verdicts=[None, False])
    assert q.take() == []  # the first held, the second refused
    assert len(q.intake.held) == 1 and q.asked == 2
    assert q.clients[1].recv(1) == b""  # the refused one was closed unread
    timeout = q.intake.timeout()
    assert timeout is not None and 0 < timeout <= JUDGE_RETRY
    assert q.take() == [] and q.asked == 2  # not judged again before its time
    wait_for(q.intake.due, 5, "the time to judge the held connection again")
    assert len(q.take()) == 1 and q.asked == 3 and not q.intake.held and q.intake.timeout() is None
