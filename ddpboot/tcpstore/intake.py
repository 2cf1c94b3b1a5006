"""How the store takes connections from its listen queues (server.py): never more at once than its open-file table
has room for, each one judged (its address, then its owner: allow.py, owner.py) before a byte of it is read.

- Room: RLIMIT_NOFILE's soft limit, less what the process has open (counted when the store starts, then followed:
  the clients it serves and the connections it holds), less RESERVE descriptors kept for judging them (a
  /proc/net table, the user name and pid of a refused client; the netlink socket is opened at the start). A batch
  of accepted connections therefore never fills the table, and the lookup that judges it finds what it needs.
- A full table: the listeners are no longer watched (a listen queue that cannot be accepted from would wake the
  loop again and again), one warning says so, and new connections wait in the kernel's listen queue, unanswered,
  until a client closes (`room_freed`) or LISTEN_RETRY passes (other files closed, or the limit raised). An
  accept() that fails all the same (EMFILE, ENFILE, ENOMEM) does the same, after counting the open files again.
- A connection whose owner cannot be looked up just now (owner.py answers None) is held: accepted, unread,
  unanswered, and judged again every JUDGE_RETRY seconds until its owner is known.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import socket
import time
from collections.abc import Callable, Sequence

RESERVE = 16  # file descriptors kept free for judging connections
ACCEPT_BATCH = 4096  # connections accepted, then judged together, before other clients are served again
LISTEN_RETRY = 1.0  # seconds between two looks at a full table's listen queues when no client closes
JUDGE_RETRY = 0.1  # seconds between two lookups of the held connections' owners
SCAN_LIMIT = 1 << 20  # descriptors probed one by one where /proc/self/fd cannot be listed

Admit = Callable[[list[socket.socket]], Sequence[bool | None]]


def open_files() -> int:
    """How many file descriptors this process has open."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one the listing itself used
    except OSError:
        pass
    count = 0
    for fd in range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], SCAN_LIMIT)):
        with contextlib.suppress(OSError):
            os.fstat(fd)
            count += 1
    return count


def room(limit: int, used: int, reserve: int = RESERVE) -> int:
    """How many more connections may be accepted with `used` of `limit` descriptors open."""
    return max(0, limit - used - reserve)


def file_limit() -> int:
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


class Intake:
    """The listen queues' side of a store server. `admit` judges accepted sockets (True: serve, False: close,
    None: hold); `served` says how many connections the server holds open; `take()` answers the ones to serve."""

    def __init__(
        self, listeners: list[socket.socket], poll: select.epoll, admit: Admit, warn: Callable[[str], None],
        served: Callable[[], int],
    ) -> None:
        self.listeners = listeners
        self.poll = poll
        self.admit = admit
        self.warn = warn
        self.served = served
        self.held: list[socket.socket] = []
        self.watching = True
        self.listen_at: float | None = None  # when to look at unwatched listen queues again
        self.judge_at: float | None = None  # when to judge the held connections again
        self._first = 0  # where the next accept starts: each socket of a group goes first in turn
        self._full_said = False
        self.others = open_files() - served()  # what the process has open besides its connections

    def used(self) -> int:
        return self.others + self.served() + len(self.held)

    def timeout(self) -> float | None:
        """Seconds until `take()` has work though no listener is ready (None: nothing planned)."""
        times = [t for t in (self.listen_at, self.judge_at) if t is not None]
        return max(0.0, min(times) - time.monotonic()) if times else None

    def due(self) -> bool:
        timeout = self.timeout()
        return timeout is not None and timeout <= 0

    def take(self) -> list[socket.socket]:
        """Accept what waits in the listen queues (as much as there is room for) and judge it with the held
        connections; the sockets to serve (the refused are closed, the undecided held)."""
        now = time.monotonic()
        if not self.watching and self.listen_at is not None and now >= self.listen_at:
            self._look_again()
        accepted = self._accept() if self.watching else []
        if not accepted and not (self.held and self.judge_at is not None and now >= self.judge_at):
            return []
        batch, self.held = self.held + accepted, []
        ready = []
        for sock, verdict in zip(batch, self.admit(batch), strict=True):
            if verdict is None:
                self.held.append(sock)
            elif verdict:
                ready.append(sock)
            else:
                sock.close()  # unread: the client gets no answer
        self.judge_at = time.monotonic() + JUDGE_RETRY if self.held else None
        if self.watching and room(file_limit(), self.used() + len(ready)) == 0:
            self._unwatch(opening=len(ready))
        return ready

    def room_freed(self) -> None:
        """A connection closed: listen again if the table was full."""
        if not self.watching:
            self._watch()

    def close(self) -> None:
        for sock in self.held:
            sock.close()
        self.held = []

    def _accept(self) -> list[socket.socket]:
        space = min(ACCEPT_BATCH, room(file_limit(), self.used()))
        accepted: list[socket.socket] = []
        if not space:
            self._unwatch()
            return accepted
        first = self._first
        self._first = (first + 1) % len(self.listeners)
        for listener in self.listeners[first:] + self.listeners[:first]:  # no queue waits behind a full batch twice
            while len(accepted) < space:
                try:
                    sock, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionAbortedError:  # reset by its client while queued
                    continue
                except OSError as exc:  # EMFILE, ENFILE, ENOMEM: the table, or the kernel, is full
                    if exc.errno in (errno.EMFILE, errno.ENFILE):
                        self.others = open_files() - self.served() - len(self.held) - len(accepted)
                    self._unwatch(f"accept: {exc.strerror}")
                    return accepted
                accepted.append(sock)
        return accepted

    def _unwatch(self, why: str = "", opening: int = 0) -> None:
        """Stop watching the listen queues until a connection closes or LISTEN_RETRY passes (`opening`: admitted
        connections the server does not serve yet)."""
        if self.watching:
            self.watching = False
            for sock in self.listeners:
                with contextlib.suppress(OSError, ValueError):
                    self.poll.unregister(sock.fileno())
        self.listen_at = time.monotonic() + LISTEN_RETRY
        if not self._full_said:
            self._full_said = True
            used, limit = self.used() + opening, file_limit()
            self.warn(
                f"its open-file table is full ({used} files open of the {limit} that ulimit -n allows, {RESERVE} "
                f"kept for the owner check{'; ' + why if why else ''}): new connections wait in the listen queue, "
                "unanswered, until one of its connections closes"
            )

    def _look_again(self) -> None:
        self.others = open_files() - self.served() - len(self.held)
        if room(file_limit(), self.used()) > 0:
            self._watch()
        else:
            self.listen_at = time.monotonic() + LISTEN_RETRY

    def _watch(self) -> None:
        self.watching = True
        self.listen_at = None
        for sock in self.listeners:
            with contextlib.suppress(OSError, ValueError):
                self.poll.register(sock.fileno(), select.EPOLLIN)
