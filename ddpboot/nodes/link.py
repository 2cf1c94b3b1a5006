"""The node link: a small process beside each launcher of a multi-node job (and of a launcher an MPI launcher
started) that watches, while the ranks run, what the launcher's own loop cannot: the other nodes, through node 0's
store, and the launcher itself and its MPI parent. The rules are nodes/outcome.py's; this is the I/O.

Why a process of its own: its beats must go on whatever the launcher does (a stack dump that takes seconds, a
console that blocks), and it must outlive the launcher to say that the launcher died. It runs in a session of its
own, so a terminal's Ctrl-C reaches the launcher and not it; it ends when the launcher tells it to, or when the
launcher's pipe closes.

Started as `python -m ddpboot.nodes.link` by nodes/watch.py. It reads one JSON object per line on stdin (the first
is its configuration, then the launcher's commands: `start`, `fail`, `end`, `quit`) and writes one per line on
stdout (`stop`: another node failed, or this node's MPI launcher is gone; `verdict`: the job's root cause at the
end; `note`: something the launcher says).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from ddpboot.contract import HELPER_IGNORED_SIGNALS
from ddpboot.nodes.check import PREFIX as CHECK_PREFIX
from ddpboot.nodes.outcome import (
    ENDED,
    EXIT_BARRIER,
    FAILURES,
    LOST_CODE,
    Beats,
    LinkTiming,
    NodeEnd,
    link_key,
    lost_record,
    root_cause,
)
from ddpboot.tcpstore.client import StoreClient, StoreGone, StoreTimeout

StoreError = (StoreGone, StoreTimeout, OSError)


class Link:
    """One node's link, from its configuration (the first line NodeLink.start writes, nodes/watch.py)."""

    def __init__(self, cfg: dict[str, Any], emit: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.emit = emit
        self.clock = clock
        self.node: int = int(cfg["node"])
        self.nnodes: int = int(cfg["nnodes"])
        self.host: str = str(cfg["host"])
        self.timing = LinkTiming(float(cfg["beat"]), int(cfg["missed"]))
        self.client: StoreClient | None = None
        self.started = False  # the launcher's workers run: failures count from now on
        self.ended: dict[str, Any] | None = None  # the launcher's `end` command, once given
        self.failures: dict[int, NodeEnd] = {}  # the failure records read (or published), by their index
        self.ends: dict[int, NodeEnd] = {}  # the nodes whose job ended, by node
        self.ends_read: set[int] = set()  # the end records read, by their index
        self.stop_sent = False
        self.published = False  # this node's own failure is in the store
        self.watching = self.nnodes > 1
        self.beats = Beats([n for n in range(1, self.nnodes)], self.timing, clock())
        self.next_beat = clock()
        self.barrier_until: float | None = None
        self.hosts: dict[int, str] = {self.node: self.host}

    # --- the launcher's commands ------------------------------------------------------------------------------

    def command(self, msg: dict[str, Any]) -> bool:
        """Carry out one command; False when the link should exit."""
        do = msg.get("do")
        if do == "start":
            self.start()
        elif do == "fail":
            self.publish(NodeEnd.decode(json.dumps(msg["record"])))
        elif do == "end":
            self.ended = msg
            return self.finish()
        elif do == "quit":
            return False
        return True

    def start(self) -> None:
        self.started = True
        if not self.watching:
            return
        try:
            self.client = StoreClient(self.cfg["addr"], int(self.cfg["port"]), connect_timeout=30.0)
            self.client.add(FAILURES, 0)
            self.client.add(ENDED, 0)
            if self.node == 0:
                for n in range(self.nnodes):
                    self.client.add(link_key("beat", n), 0)
            # The hosts every node named at the check-in (nodes/check.py: `COUNT HOST`), for the messages.
            names = self.client.multi_get([f"{CHECK_PREFIX}/{n}" for n in range(self.nnodes)])
            self.hosts = {n: v.decode(errors="replace").partition(" ")[2] for n, v in enumerate(names)}
        except StoreError as exc:
            self.store_lost(exc)
        self.beats.since = self.clock()
        self.next_beat = self.clock()

    def publish(self, record: NodeEnd) -> None:
        """A failure record into the store (once per node for its own failures)."""
        if record.node == self.node:
            if self.published:
                return
            self.published = True
        if self.client is None:
            self.failures[-len(self.failures) - 1] = record  # kept for the verdict: the store is not reachable
            return
        try:
            index = self.client.add(FAILURES, 1, timeout=self.timing.lost_after)
            self.client.set(link_key("failure", index), record.encode())
            self.failures[index] = record
        except StoreError as exc:
            self.store_lost(exc)

    def finish(self) -> bool:
        """The launcher's job ended: say so in the store, wait (node 0) for the others, answer the verdict."""
        assert self.ended is not None
        code = int(self.ended["code"])
        if code and self.ended.get("publish") and not self.published:
            self.publish(NodeEnd(self.node, self.host, code, str(self.ended["what"]), time.time()))
        if self.client is not None:
            try:
                index = self.client.add(ENDED, 1, timeout=self.timing.lost_after)
                mine = NodeEnd(self.node, self.host, code, "ended", time.time())
                self.client.set(link_key("end", index), mine.encode())
            except StoreError as exc:
                self.store_lost(exc)
        if self.node == 0 and self.client is not None and self.nnodes > 1:
            self.barrier_until = self.clock() + EXIT_BARRIER
            return True  # the beats go on until every node has ended (tick)
        return self.verdict()

    def verdict(self) -> bool:
        self.read()
        root = root_cause(self.failures.items())
        self.emit({"ev": "verdict", "root": None if root is None else json.loads(root.encode())})
        return False

    # --- the store ------------------------------------------------------------------------------------------

    def tick(self) -> bool:
        """One beat: this node's counter, the others' failures and ends, and (node 0) the others' beats."""
        self.next_beat = self.clock() + self.timing.beat
        if self.client is None:
            return True
        try:
            self.client.add(link_key("beat", self.node), 1, timeout=self.timing.lost_after)
            self.read()
            if self.node == 0:
                self.watch_beats()
        except StoreError as exc:
            self.store_lost(exc)
        if self.barrier_until is not None:
            return self.barrier()
        return True

    def read(self) -> None:
        """The failure and end records published since the last reading; the first failure of another node is
        told to the launcher (stop)."""
        if self.client is None:
            return
        failures, ended = (int(v) for v in self.client.multi_get([FAILURES, ENDED], timeout=self.timing.lost_after))
        for index in range(1, failures + 1):
            if index not in self.failures and self.client.check([link_key("failure", index)]):
                record = self.failures[index] = NodeEnd.decode(self.client.get(link_key("failure", index)))
                if record.last or record.by is not None:  # a lost node, a dead launcher: no end record comes
                    self.beats.done.add(record.node)
        for index in range(1, ended + 1):
            if index not in self.ends_read and self.client.check([link_key("end", index)]):
                self.ends_read.add(index)
                record = NodeEnd.decode(self.client.get(link_key("end", index)))
                self.ends.setdefault(record.node, record)
                self.beats.done.add(record.node)
        self.tell_stop()

    def tell_stop(self) -> None:
        others = [(i, r) for i, r in self.failures.items()
                  if r.node != self.node or r.by not in (None, self.node)]  # also: another node lost this one
        if self.stop_sent or not others or self.ended is not None:
            return
        self.stop_sent = True
        root = root_cause(self.failures.items())
        assert root is not None
        self.emit({"ev": "stop", "record": json.loads(root.encode())})

    def watch_beats(self) -> None:
        assert self.client is not None
        watched = self.beats.watched()
        if not watched or not self.started:
            return
        values = self.client.multi_get([link_key("beat", n) for n in watched], timeout=self.timing.lost_after)
        lost = self.beats.observe({n: int(v) for n, v in zip(watched, values, strict=True)}, self.clock())
        for node, silent in lost:
            self.publish(lost_record(node, self.host_of(node), silent, self.node, time.time()))
        if lost:
            self.tell_stop()

    def host_of(self, node: int) -> str:
        return self.hosts.get(node, "")

    def barrier(self) -> bool:
        """Node 0 after its own end: keep the store up until every other node has ended or is lost."""
        assert self.barrier_until is not None
        if not self.beats.watched() or self.client is None or self.clock() >= self.barrier_until:
            if self.beats.watched():
                self.emit({"ev": "note", "text": f"nodes {', '.join(map(str, self.beats.watched()))} still run "
                                                 f"{EXIT_BARRIER:g} s after this node ended; node 0's store stops now"})
            return self.verdict()
        return True

    def store_lost(self, exc: BaseException) -> None:
        """Node 0's store no longer answers: on another node, node 0 is gone unless it ended (then quietly)."""
        self.client = None
        if self.node == 0 or 0 in self.ends or self.ended is not None:
            return
        record = NodeEnd(0, self.host_of(0), LOST_CODE, f"its store at {self.cfg['addr']}:{self.cfg['port']} no "
                         f"longer answers ({exc})", time.time(), by=self.node)
        self.failures[-len(self.failures) - 1] = record
        self.tell_stop()

    # --- the launcher and its MPI parent --------------------------------------------------------------------

    def launcher_gone(self) -> None:
        if self.started and self.ended is None:
            self.publish(NodeEnd(self.node, self.host, LOST_CODE, f"its ddpboot launcher (pid {self.cfg['launcher']})"
                                 " died", time.time(), last=True))

    def mpi_parent_gone(self) -> None:
        what = (f"its MPI launcher ({self.cfg['mpi_name']}, pid {self.cfg['mpi_parent']}) is gone: "
                "the MPI job was killed or its daemon died")
        record = NodeEnd(self.node, self.host, LOST_CODE, what, time.time())
        self.publish(record)
        if self.ended is None:
            self.emit({"ev": "stop", "record": json.loads(record.encode())})


def main() -> int:
    for sig in HELPER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # the launcher blocks its signals for its signalfd

    def emit(msg: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

    lines = _Lines(sys.stdin.fileno())
    first = lines.first(timeout=30.0)
    if first is None:
        return 1
    link = Link(json.loads(first), emit)
    parent = _pidfd(link.cfg.get("mpi_parent"))
    if link.cfg.get("mpi_parent") and parent is None:  # gone before the link started
        link.mpi_parent_gone()
    return _loop(link, lines, parent)


def _loop(link: Link, lines: _Lines, parent: int | None) -> int:
    while True:
        timeout = max(link.next_beat - link.clock(), 0.0) if link.client is not None else None
        fds = [lines.fd] + ([parent] if parent is not None else [])
        ready = [lines.fd] if lines.pending else select.select(fds, [], [], timeout)[0]
        if lines.fd in ready:
            for msg in lines.read():
                if msg is None:  # the launcher's pipe closed without `end` or `quit`: it died
                    link.launcher_gone()
                    return 0
                if not link.command(json.loads(msg)):
                    return 0
        if parent is not None and parent in ready:
            os.close(parent)
            parent = None
            link.mpi_parent_gone()
        if link.client is not None and link.clock() >= link.next_beat and not link.tick():
            return 0


class _Lines:
    """Lines from a pipe, read only when select says there is something; None once it closed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.pending: list[str | None] = []

    def read(self) -> list[str | None]:
        if not self.pending:
            self._fill()
        out, self.pending = self.pending, []
        return out

    def _fill(self) -> None:
        data = os.read(self.fd, 65536)
        self.buf += data
        *whole, self.buf = self.buf.split(b"\n")
        self.pending += [w.decode() for w in whole if w.strip()]
        if not data:
            self.pending.append(None)

    def first(self, timeout: float) -> str | None:
        """The first line, within `timeout` seconds; the lines after it stay for `read`."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            self._fill()
        return self.pending.pop(0)


def _pidfd(pid: object) -> int | None:
    """A pidfd of the MPI parent (readable once it exits), or None (no parent to watch, or it is gone already)."""
    if not isinstance(pid, int) or pid <= 1:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
