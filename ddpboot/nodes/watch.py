"""The launcher's end of its node link (nodes/link.py): start it, tell it the job's start, its root cause and its
end, and hear from it that another node failed (nodes/outcome.py has the rules).

The launcher starts the link before its supervisor starts anything (so the link is one of the launcher's own
children, not a process a rank left), starts it watching once every node has checked in, asks it at every watch
tick (`poll`, non-blocking), and at the end waits for its verdict: node 0's link answers once every node has
ended, so node 0's store outlives everyone's last reading.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpboot.cluster.mpi import launcher_pid, mpi_flavour
from ddpboot.nodes.outcome import LOST_CODE, LinkTiming, NodeEnd, rank_failure
from ddpboot.nodes.static import NodeSetup
from ddpboot.procfs import PROC

VERDICT_WAIT = 10.0  # seconds a node other than node 0 waits for its link's verdict at the end
QUIT_WAIT = 2.0  # seconds the link gets to exit once told to


def mpi_parent(env: dict[str, str] | os._Environ[str], proc: Path = PROC) -> tuple[int, str] | None:
    """The MPI process that started this launcher (mpirun, orted, hydra_pmi_proxy, ...): its pid and command
    name; None when no MPI launcher's variables are set or no such ancestor runs (variables left in a shell)."""
    if mpi_flavour(env) is None:
        return None
    pid = launcher_pid(proc=proc)
    if pid is None:
        return None
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return None
    return pid, comm


def wants_link(nodes: NodeSetup, parent: tuple[int, str] | None) -> bool:
    """A fixed node count of several nodes, or any launcher an MPI launcher started (its death must end the
    ranks); an elastic job has its own rounds (launch/elastic/)."""
    return not nodes.elastic and (nodes.nnodes > 1 or parent is not None)


class NodeLink:
    """The link process and its pipes."""

    def __init__(self, proc: subprocess.Popen[bytes], node: int) -> None:
        self.proc = proc
        self.node = node
        assert proc.stdout is not None and proc.stdin is not None
        self.out = proc.stdout.fileno()
        os.set_blocking(self.out, False)
        self.buf = b""
        self.events: list[dict[str, Any]] = []
        self.closed = False  # its stdout closed: the link process ended
        self.started = False
        self.sent_failure = False  # this node's root cause went to the other nodes
        self.stopped_by: NodeEnd | None = None  # the other node's failure that stopped this node
        self.ended = False

    @classmethod
    def start(cls, nodes: NodeSetup, timing: LinkTiming, parent: tuple[int, str] | None,
              env: dict[str, str] | None = None) -> NodeLink:
        cfg = {"addr": nodes.master_addr, "port": nodes.master_port, "nnodes": nodes.nnodes, "node": nodes.node_rank,
               "host": socket.gethostname(), "beat": timing.beat, "missed": timing.missed, "launcher": os.getpid(),
               "mpi_parent": parent[0] if parent else None, "mpi_name": parent[1] if parent else ""}
        base = dict(os.environ if env is None else env)
        here = str(Path(__file__).resolve().parents[2])  # where this ddpboot is imported from
        base["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [base.get("PYTHONPATH")])])
        proc = subprocess.Popen([sys.executable, "-m", "ddpboot.nodes.link"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=base, start_new_session=True, close_fds=True)
        link = cls(proc, nodes.node_rank)
        link._send({**cfg})
        return link

    # --- to the link ----------------------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()

    def begin(self) -> None:
        """Every node has checked in and the workers start: the link starts beating and watching."""
        self.started = True
        self._send({"do": "start"})

    def failed(self, rank: int, code: int, how: str, line: str = "") -> None:
        """This node's root cause, as soon as the supervisor chose it."""
        if self.sent_failure or self.stopped_by is not None:
            return
        self.sent_failure = True
        record = rank_failure(self.node, socket.gethostname(), rank, code, how, time.time(), line)
        self._send({"do": "fail", "record": json.loads(record.encode())})

    def end(self, code: int, what: str, tick: Callable[[Callable[[], str]], None] | None = None) -> NodeEnd | None:
        """This node's job ended with `code` (`what` says how, for a failure no rank caused): the job's root cause
        as the link knows it once every node it waits for has ended; None when no node failed."""
        self.ended = True
        publish = not self.sent_failure and self.stopped_by is None
        self._send({"do": "end", "code": code, "what": what, "publish": publish})
        waited = time.monotonic()
        while not self.closed:
            if self.node != 0 and time.monotonic() - waited > VERDICT_WAIT:
                return None
            if tick is not None:
                tick(lambda: "node 0 keeping its store up for the nodes still running (every node must end before "
                              "node 0's store stops)")
            for event in self._read(0.5):
                if event.get("ev") == "verdict":
                    root = event.get("root")
                    return None if root is None else NodeEnd.decode(json.dumps(root))
        return None

    def close(self) -> None:
        """Tell the link to exit (without a word to the other nodes) and reap it."""
        if self.proc.poll() is None:
            self._send({"do": "quit"})
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(QUIT_WAIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ChildProcessError:  # reaped by the supervisor's waitpid(-1)
            pass
        with contextlib.suppress(OSError):
            assert self.proc.stdout is not None
            self.proc.stdout.close()

    # --- from the link --------------------------------------------------------------------------------------

    def poll(self) -> tuple[NodeEnd | None, list[str]]:
        """Non-blocking: the failure that must stop this node (once), and the notes the link sent."""
        stop, notes = None, []
        for event in self._read(0.0):
            if event.get("ev") == "stop" and self.stopped_by is None and not self.ended:
                self.stopped_by = stop = NodeEnd.decode(json.dumps(event["record"]))
            elif event.get("ev") == "note":
                notes.append(str(event.get("text", "")))
        if self.closed and self.started and not self.ended and self.stopped_by is None:
            self.stopped_by = stop = NodeEnd(self.node, socket.gethostname(), LOST_CODE,
                                             f"its node link (pid {self.proc.pid}) ended unexpectedly, so the other "
                                             "nodes can no longer hear from it", time.time())
        return stop, notes

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        if not self.closed and select.select([self.out], [], [], timeout)[0]:
            try:
                data = os.read(self.out, 65536)
            except BlockingIOError:
                data = None
            if data == b"":
                self.closed = True
            elif data:
                self.buf += data
        *whole, self.buf = self.buf.split(b"\n")
        for line in whole:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))
        out, self.events = self.events, []
        return out
