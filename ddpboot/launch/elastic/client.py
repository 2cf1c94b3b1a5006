"""The launcher's handle on its rendezvous agent (agent.py, a child process): requests and answers, one JSON line
each over a socketpair (agent.py documents the protocol), and the stop signals that may end a wait for an answer.

While no Supervisor runs (it reads signals itself), the launcher's handled signals are read from a signalfd during
each wait on the agent: a stop signal (contract.STOP_SIGNALS) becomes Stopped, any other one is reported and
ignored, since no worker runs to forward it to.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

from ddpboot.contract import STOP_SIGNALS
from ddpboot.launch.elastic.rounds import Round
from ddpboot.launch.logs import Console
from ddpboot.launch.procs.groups import signal_process
from ddpboot.launch.procs.signals import SignalFd
from ddpboot.launch.procs.spawn import spawn

WATCH_REPLY_WAIT = 1.0  # how long a "nodes waiting?" poll waits for its answer before carrying on without it
NOTICE_AFTER = 5.0  # seconds a wait for the next round lasts before the launcher says what it waits for
ANSWER_MARGIN = 60.0  # seconds the agent gets beyond a request's own work to answer it
AGENT_EXIT_WAIT = 5.0  # seconds the agent gets to exit after "quit" before SIGKILL


class AgentError(Exception):
    """The agent answered with an error, or is gone. `kind` (agent.py lists them) says what failed; "agent": the
    agent process itself exited or did not answer."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Stopped(Exception):
    """A stop signal (INT, TERM, HUP, QUIT) arrived while no worker ran."""

    def __init__(self, signo: int) -> None:
        super().__init__(signal.Signals(signo).name)
        self.signo = signo


@contextlib.contextmanager
def signal_reader(signals: tuple[signal.Signals, ...]) -> Iterator[SignalFd]:
    """The handled signals, read from a signalfd while no Supervisor runs (it opens its own)."""
    fd = SignalFd(signals)
    try:
        yield fd
    finally:
        fd.close()


def _check_signals(sigfd: SignalFd, console: Console) -> None:
    for info in sigfd.read():
        if info.signo in STOP_SIGNALS:
            raise Stopped(info.signo)
        console.message(f"ddpboot: received {signal.Signals(info.signo).name} between rounds: no worker runs now, "
                        "nothing to forward it to")


class RdzvAgent:
    """One rendezvous agent process and the launcher's end of its socketpair."""

    def __init__(self, pid: int, sock: socket.socket, console: Console) -> None:
        self.pid = pid
        self.sock = sock
        self.console = console
        self.buf = b""
        self.pending: str | None = None  # a request whose answer has not been read yet
        self.gone = False  # the agent process exited (or its socket broke)
        self.closed = False  # the rendezvous was closed, as the last "waiting" answer said

    @classmethod
    def start(cls, params: dict[str, Any], env: dict[str, str], console: Console) -> RdzvAgent:
        """Start the agent (`params`: what agent.py's main() takes) in its own session, SIGKILLed with the
        launcher."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(env)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TCPStore's connection retries are expected here
        try:
            pid = spawn([sys.executable, "-m", "ddpboot.launch.elastic.agent", json.dumps(params)], env,
                        theirs.fileno(), 2)
        finally:
            theirs.close()
        return cls(pid, mine, console)

    # --- what the rounds ask ---------------------------------------------------------------------------------

    def wait_ready(self, sigfd: SignalFd) -> None:
        """Until the agent holds torch's rendezvous handler; AgentError if it cannot make one."""
        self._reply("start", None, sigfd)

    def next_round(
        self, sigfd: SignalFd, *, nproc: int, host: str, addr: str, port: int, notice: str | None = None
    ) -> Round:
        """Join the next round with this node's `nproc` ranks on `host`; `addr`:`port` is the workers' store this
        node serves if it becomes group rank 0. `notice` is said once if the round takes more than NOTICE_AFTER s."""
        # An unanswered "waiting" of the last round is dropped when its answer comes.
        self._send("next", nproc=nproc, host=host, addr=addr, port=port)
        msg = self._reply("next", None, sigfd, notice)
        assert msg is not None  # no deadline: an answer, an AgentError or Stopped
        return Round.from_json(msg)

    def nodes_waiting(self) -> int | None:
        """How many nodes wait to join; None when the agent has not answered yet (asked again next time)."""
        if self.pending != "waiting":
            self._send("waiting")
            wait = WATCH_REPLY_WAIT
        else:
            wait = 0.0  # still unanswered from last time: look, do not wait again
        msg = self._reply("waiting", wait)
        if msg is None:
            return None
        self.closed = bool(msg.get("closed", False))
        return int(msg.get("waiting", 0))

    def finish(self, sigfd: SignalFd, barrier_timeout: float) -> None:
        """This node succeeded: wait up to `barrier_timeout` s for every node of the round, then close the
        rendezvous."""
        self._request("finish", sigfd, timeout=barrier_timeout + ANSWER_MARGIN, barrier_timeout=barrier_timeout)

    def close_rendezvous(self, sigfd: SignalFd) -> None:
        """The job failed for good here: close the rendezvous, so that the other nodes stop instead of re-forming."""
        self._request("close", sigfd, timeout=ANSWER_MARGIN)

    def quit(self) -> None:
        """Stop the agent (without closing the rendezvous) and reap it. An agent inside a request (a stop signal
        ended the launcher's wait for the next round) is in torch's blocking rendezvous call and cannot read "quit":
        it gets SIGTERM at once."""
        with contextlib.suppress(OSError):
            self.sock.sendall(b'{"cmd": "quit"}\n')
        self.sock.close()
        if self.pending is not None and not self.gone:
            with contextlib.suppress(OSError):
                signal_process(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + AGENT_EXIT_WAIT
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return  # reaped already (the supervisor reaps every child)
            if pid:
                return
            if time.monotonic() >= deadline:
                with contextlib.suppress(OSError):
                    signal_process(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                return
            time.sleep(0.02)

    # --- the line protocol -----------------------------------------------------------------------------------

    def _send(self, cmd: str, **fields: Any) -> None:
        try:
            self.sock.sendall(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")
        except OSError as exc:
            self.gone = True
            raise AgentError(f"the rendezvous agent (pid {self.pid}) is gone ({exc})", "agent") from None
        self.pending = cmd

    def _request(self, cmd: str, sigfd: SignalFd, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        self._send(cmd, **fields)
        msg = self._reply(cmd, timeout, sigfd)
        if msg is None:
            raise AgentError(f"the rendezvous agent did not answer {cmd!r} within {timeout:g} s", "agent")
        return msg

    def _reply(
        self, cmd: str, timeout: float | None, sigfd: SignalFd | None = None, notice: str | None = None
    ) -> dict[str, Any] | None:
        """The answer to `cmd` (older answers are dropped), None after `timeout` s; Stopped on a stop signal.
        `notice` is said once when no answer came within NOTICE_AFTER s."""
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ, "agent")
            if sigfd is not None:
                sel.register(sigfd, selectors.EVENT_READ, "signals")
            while True:
                msg = self._answer(cmd)
                if msg is not None:
                    return msg
                now = time.monotonic()
                if notice is not None and now - start >= NOTICE_AFTER:
                    self.console.message(f"ddpboot: {notice}")
                    notice = None
                left = None if deadline is None else max(deadline - now, 0.0)
                if notice is not None:
                    left = min(left if left is not None else NOTICE_AFTER, max(start + NOTICE_AFTER - now, 0.0))
                events = sel.select(left)
                if not events and deadline is not None and time.monotonic() >= deadline:
                    return None
                for key, _ in events:
                    if key.data == "agent":
                        self._fill()
                    elif sigfd is not None:
                        _check_signals(sigfd, self.console)

    def _answer(self, cmd: str) -> dict[str, Any] | None:
        """The answer to `cmd` among the lines received so far (the others are dropped); AgentError for an error."""
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg: dict[str, Any] = json.loads(line)
            if msg.get("re") == cmd:
                self.pending = None
                if "error" in msg:
                    raise AgentError(str(msg["error"]), str(msg.get("kind", "other")))
                return msg
        return None

    def _fill(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.gone = True
            raise AgentError(f"the rendezvous agent (pid {self.pid}) exited; its errors are above", "agent")
        self.buf += data
