"""The launcher's handle on its rendezvous agent (ddpboot.launch.elastic.client), with the test playing the agent
on the other end of the socketpair: one JSON line per request and per answer (agent.py's protocol)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator

import pytest

from ddpboot.launch.elastic.client import AgentError, RdzvAgent, Stopped, signal_reader
from ddpboot.launch.elastic.rounds import Round
from ddpboot.launch.logs import Console
from ddpboot.launch.spec import Std

NEXT = {"re": "next", "round": 2, "group_rank": 0, "nnodes": 1, "rank_offset": 0, "world_size": 2,
        "master_addr": "127.0.0.1", "master_port": 1234, "nodes": [[2, "here"]]}


class Messages(Console):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def message(self, text: str, stream: Std = Std.ERR) -> None:
        self.lines.append(text)


class AgentEnd:
    """The agent's end of the socketpair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb")

    def say(self, *msgs: dict[str, object]) -> None:
        self.sock.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in msgs))

    def request(self) -> dict[str, object]:
        msg: dict[str, object] = json.loads(self.rfile.readline())
        return msg


@pytest.fixture
def pair() -> Iterator[tuple[RdzvAgent, AgentEnd, Messages]]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    console = Messages()
    agent = RdzvAgent(os.getpid(), mine, console)  # quit() is not called: the pid is no child of ours
    end = AgentEnd(theirs)
    yield agent, end, console
    mine.close()
    end.rfile.close()
    theirs.close()


def test_ready_then_a_round(pair: tuple[RdzvAgent, AgentEnd, Messages]) -> None:
    agent, end, _ = pair
    with signal_reader(()) as sigfd:
        end.say({"re": "start", "ready": True})
        agent.wait_ready(sigfd)
        end.say({"re": "waiting", "waiting": 0}, NEXT)  # a late answer to an earlier poll is dropped
        rnd = agent.next_round(sigfd, nproc=2, host="here", addr="127.0.0.1", port=1234)
    assert end.request() == {"cmd": "next", "nproc": 2, "host": "here", "addr": "127.0.0.1", "port": 1234}
    assert rnd == Round.from_json(NEXT)


def test_an_error_answer_is_an_agent_error_of_its_kind(pair: tuple[RdzvAgent, AgentEnd, Messages]) -> None:
    agent, end, _ = pair
    end.say({"re": "start", "error": "ValueError: bad conf", "kind": "usage"})
    with signal_reader(()) as sigfd, pytest.raises(AgentError, match="bad conf") as err:
        agent.wait_ready(sigfd)
    assert err.value.kind == "usage" and not agent.gone


def test_a_poll_for_waiting_nodes_is_sent_once_until_answered(pair: tuple[RdzvAgent, AgentEnd, Messages]) -> None:
    agent, end, _ = pair
    end.say({"re": "waiting", "waiting": 2})
    assert agent.nodes_waiting() == 2
    assert end.request() == {"cmd": "waiting"}
    threading.Timer(0.05, end.say, args=({"re": "noise"},)).start()
    assert agent.nodes_waiting() is None  # no answer within the poll's wait
    assert end.request() == {"cmd": "waiting"}
    assert agent.nodes_waiting() is None  # still pending: not asked again, not waited for
    end.say({"re": "waiting", "waiting": 0})
    assert agent.nodes_waiting() == 0 and not agent.closed
    end.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        end.sock.recv(1)  # the second and third polls sent nothing
    end.sock.setblocking(True)
    end.say({"re": "waiting", "waiting": 0, "closed": True})  # another node's job ended for good
    assert agent.nodes_waiting() == 0 and agent.closed


def test_an_agent_that_exits_is_gone(pair: tuple[RdzvAgent, AgentEnd, Messages]) -> None:
    agent, end, _ = pair
    end.sock.shutdown(socket.SHUT_WR)
    with signal_reader(()) as sigfd, pytest.raises(AgentError, match="exited; its errors are above") as err:
        agent.finish(sigfd, 1.0)
    assert err.value.kind == "agent" and agent.gone


@pytest.fixture
def signal_mask() -> Iterator[None]:
    """Signals blocked by a signalfd in this test stay blocked for this thread only until the test ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


@pytest.mark.usefixtures("signal_mask")
def test_a_stop_signal_while_waiting_for_an_answer(pair: tuple[RdzvAgent, AgentEnd, Messages]) -> None:
    agent, end, console = pair
    with signal_reader((signal.SIGHUP, signal.SIGUSR1)) as sigfd:
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # this thread only: blocked, read from sigfd
        end.say({"re": "close", "ok": True})
        agent.close_rendezvous(sigfd)  # another signal is reported, and the answer still taken
        assert console.lines == [
            "ddpboot: received SIGUSR1 between rounds: no worker runs now, nothing to forward it to"]
        signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
        with pytest.raises(Stopped) as stop:
            agent.close_rendezvous(sigfd)
    assert stop.value.signo == signal.SIGHUP and str(stop.value) == "SIGHUP"
