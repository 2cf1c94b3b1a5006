"""Elastic jobs: `--nnodes MIN:MAX` with torch's c10d rendezvous, torchrun's semantics, one Supervisor per round.

    ddpboot --nnodes 1:4 --nproc gpu --rdzv-backend c10d --rdzv-endpoint node01:29400 train.py

Every node runs this launcher with the same options. torch's c10d rendezvous (torch.distributed.elastic.rendezvous,
hosted on the endpoint's machine by that node's launcher) forms rounds of MIN..MAX nodes; each round gives this node
its group rank and the node count. Group rank 0 serves the round's worker store (ddpboot's own, as on one node) on
its --local-addr and a fresh port and publishes that address through the rendezvous store; global ranks follow
torchrun (each node's ranks come after those of the lower group ranks). Then a Supervisor runs the round's workers.

What ends a round (torchrun's rules):
- a node waiting to join (torch's num_nodes_waiting() > 0, asked every WATCH_INTERVAL s): the local workers are
  stopped and every node re-joins; membership changes never count against --max-restarts;
- a worker failure (on this node, or a peer's collective error after another node died): with restarts left, the
  group re-joins with TORCHELASTIC_RESTART_COUNT one higher; without, the launcher exits with the failing rank's
  exit code and closes the rendezvous so that the other nodes stop too;
- success: this node waits (up to EXIT_BARRIER s) until every node of the round has succeeded, closes the
  rendezvous and exits 0;
- a stop signal to the launcher: workers stopped, exit 128+N, the rendezvous left open (as torchrun).

The rendezvous handler imports torch and runs a keep-alive thread, which the launcher must not (it forks workers
and never imports torch): it lives in a child process, rdzv_agent.py, spoken to over a socketpair.

GPU selection and locks happen once per launcher: each round's plan is the node's reserved plan with the round's
ranks, world size, node rank and node count.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddpboot.contract import STOP_SIGNALS
from ddpboot.errors import UsageError
from ddpboot.launch.logs import Console, run_dir
from ddpboot.launch.procs.signals import SignalFd
from ddpboot.launch.procs.spawn import spawn
from ddpboot.launch.spec import LaunchSpec
from ddpboot.launch.supervisor import AttemptResult, Supervisor
from ddpboot.nodes.elastic import default_run_id
from ddpboot.nodes.static import NodeSetup
from ddpboot.selection.locks import GpuLocks
from ddpboot.selection.planner import Plan
from ddpboot.tcpstore.address import bind_store_socket
from ddpboot.units import plural

WATCH_INTERVAL = 0.5  # seconds between "nodes waiting?" while workers run (torch caches its state for 1 s)
WATCH_REPLY_WAIT = 1.0  # how long the supervisor's loop waits for that answer before carrying on without it
EXIT_BARRIER = 300.0  # torchrun's exit_barrier_timeout
AGENT_EXIT_WAIT = 5.0  # seconds the agent gets to exit after "quit" before SIGKILL


# --- the agent process -------------------------------------------------------------------------------------------


class AgentError(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class Stopped(Exception):
    """A stop signal (INT, TERM, HUP, QUIT) arrived while no worker ran."""

    def __init__(self, signo: int) -> None:
        super().__init__(signal.Signals(signo).name)
        self.signo = signo


class RdzvAgent:
    """The launcher's handle on its rendezvous agent (rdzv_agent.py): requests and answers, one JSON line each."""

    def __init__(self, pid: int, sock: socket.socket, console: Console) -> None:
        self.pid = pid
        self.sock = sock
        self.console = console
        self.buf = b""
        self.pending: str | None = None  # a request whose answer has not been read yet
        self.gone = False

    @classmethod
    def start(cls, params: dict[str, Any], env: dict[str, str], console: Console) -> RdzvAgent:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(env)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TCPStore's connection retries are expected here
        try:
            pid = spawn([sys.executable, "-m", "ddpboot.launch.elastic.agent", json.dumps(params)], env,
                        theirs.fileno(), 2)
        finally:
            theirs.close()
        return cls(pid, mine, console)

    def send(self, cmd: str, **fields: Any) -> None:
        try:
            self.sock.sendall(json.dumps({"cmd": cmd, **fields}).encode() + b"\n")
        except OSError as exc:
            self.gone = True
            raise AgentError(f"the rendezvous agent (pid {self.pid}) is gone ({exc})", "agent") from None
        self.pending = cmd

    def _line(self) -> dict[str, Any] | None:
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def _fill(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.gone = True
            raise AgentError(f"the rendezvous agent (pid {self.pid}) exited; its errors are above", "agent")
        self.buf += data

    def reply(self, cmd: str, timeout: float | None, sigfd: SignalFd | None = None) -> dict[str, Any] | None:
        """The answer to `cmd` (older answers are dropped), None after `timeout` s; Stopped on a stop signal."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ, "agent")
            if sigfd is not None:
                sel.register(sigfd, selectors.EVENT_READ, "signals")
            while True:
                msg = self._line()
                while msg is not None:
                    if msg.get("re") == cmd:
                        self.pending = None
                        if "error" in msg:
                            raise AgentError(str(msg["error"]), str(msg.get("kind", "other")))
                        return msg
                    msg = self._line()
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                events = sel.select(left)
                if not events and deadline is not None and time.monotonic() >= deadline:
                    return None
                for key, _ in events:
                    if key.data == "agent":
                        self._fill()
                    elif sigfd is not None:
                        _check_signals(sigfd, self.console)

    def request(self, cmd: str, sigfd: SignalFd | None, timeout: float | None = None, **fields: Any) -> dict[str, Any]:
        self.send(cmd, **fields)  # an unanswered "waiting" of the last round is dropped when its answer comes
        msg = self.reply(cmd, timeout, sigfd)
        if msg is None:
            raise AgentError(f"the rendezvous agent did not answer {cmd!r} within {timeout:g} s", "agent")
        return msg

    def quit(self) -> None:
        """Stop the agent (without closing the rendezvous) and reap it."""
        with contextlib.suppress(OSError):
            self.sock.sendall(b'{"cmd": "quit"}\n')
        self.sock.close()
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
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                return
            time.sleep(0.02)


def _check_signals(sigfd: SignalFd, console: Console) -> None:
    for info in sigfd.read():
        if info.signo in STOP_SIGNALS:
            raise Stopped(info.signo)
        console.message(f"ddpboot: received {signal.Signals(info.signo).name} between rounds: no worker runs now, "
                        "nothing to forward it to")


@contextlib.contextmanager
def _signals(signals: tuple[signal.Signals, ...]) -> Iterator[SignalFd]:
    """The handled signals, read from a signalfd while no Supervisor runs (it opens its own)."""
    fd = SignalFd(signals)
    try:
        yield fd
    finally:
        fd.close()


# --- rounds ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    number: int | None  # torch's round counter (the same on every node), None if unknown
    group_rank: int
    nnodes: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    nodes: tuple[tuple[int, str], ...]  # (ranks, host) per group rank

    @classmethod
    def from_json(cls, msg: dict[str, Any]) -> Round:
        return cls(
            number=None if msg.get("round") is None else int(msg["round"]),
            group_rank=int(msg["group_rank"]),
            nnodes=int(msg["nnodes"]),
            rank_offset=int(msg["rank_offset"]),
            world_size=int(msg["world_size"]),
            master_addr=str(msg["master_addr"]),
            master_port=int(msg["master_port"]),
            nodes=tuple((int(n), str(h)) for n, h in msg["nodes"]),
        )


def round_plan(plan: Plan, rnd: Round) -> Plan:
    """The node's reserved plan with this round's global ranks, world size, node rank and node count."""
    ranks = tuple(replace(s, rank=rnd.rank_offset + s.local_rank) for s in plan.ranks)
    cluster = {**plan.cluster, "round": rnd.number, "node_rank": rnd.group_rank, "nnodes": rnd.nnodes,
               "master_addr": rnd.master_addr, "master_port": rnd.master_port}
    return replace(plan, ranks=ranks, world_size=rnd.world_size, nnodes=rnd.nnodes, node_rank=rnd.group_rank,
                   cluster=cluster)


def run_elastic(
    spec: LaunchSpec,
    plan: Plan,
    env: dict[str, str],
    nodes: NodeSetup,
    *,
    locks: GpuLocks | None = None,
    rdzv_id: str | None = None,
    rdzv_backend: str = "c10d",
    rdzv_conf: dict[str, str] | None = None,
    max_restarts: int = 0,
    log_dir: str | None = None,
    supervisor_kwargs: dict[str, Any] | None = None,
    console: Console | None = None,
) -> int:
    """Run this node's part of an elastic job until it succeeds, fails for good or is stopped; the exit code."""
    try:
        return _Driver(spec, plan, env, nodes, rdzv_id, rdzv_backend, rdzv_conf or {}, max_restarts, log_dir,
                       supervisor_kwargs or {}, console or Console()).run()
    finally:
        if locks is not None:
            locks.release()


class _Driver:
    def __init__(
        self,
        spec: LaunchSpec,
        plan: Plan,
        env: dict[str, str],
        nodes: NodeSetup,
        rdzv_id: str | None,
        rdzv_backend: str,
        conf: dict[str, str],
        max_restarts: int,
        log_dir: str | None,
        supervisor_kwargs: dict[str, Any],
        console: Console,
    ) -> None:
        if nodes.source != "elastic" or nodes.rdzv_endpoint is None:
            raise UsageError("an elastic job needs --nnodes MIN:MAX with --rdzv-endpoint HOST:PORT.")
        if rdzv_backend.strip().lower() != "c10d":
            raise UsageError(f"--rdzv-backend {rdzv_backend}: elastic ranges (--nnodes MIN:MAX) need c10d.")
        self.spec, self.plan, self.env, self.nodes = spec, plan, env, nodes
        self.endpoint = nodes.rdzv_endpoint
        self.run_id = rdzv_id if rdzv_id and rdzv_id != "none" else default_run_id(self.endpoint)
        self.conf = conf
        self.max_restarts = max_restarts
        self.log_dir = log_dir
        self.supervisor_kwargs = supervisor_kwargs
        self.console = supervisor_kwargs.get("console") or console
        self.store_addr = nodes.master_addr
        self.agent: RdzvAgent | None = None
        self.watch_broken = False
        self.base: Path | None = None

    def say(self, text: str) -> None:
        self.console.message(f"ddpboot: {text}")

    def logs(self) -> Path | None:
        """DIR/RUN_ID (made unique), created when the first round starts."""
        if self.log_dir and self.base is None:
            self.base = run_dir(Path(self.log_dir), self.run_id)
            self.say(f"logs in {self.base}")
        return self.base

    def run(self) -> int:
        params = {"endpoint": self.endpoint, "run_id": self.run_id, "min_nodes": self.nodes.min_nodes,
                  "max_nodes": self.nodes.max_nodes, "local_addr": self.store_addr, "conf": self.conf}
        self.agent = RdzvAgent.start(params, self.env, self.console)
        try:
            return self._rounds()
        except Stopped as stop:
            self.say(f"{stop} while waiting for the rendezvous: stopping")
            return 128 + stop.signo
        finally:
            self.agent.quit()

    def _rounds(self) -> int:
        agent = self.agent
        assert agent is not None
        with _signals(self.spec.signals) as sigfd:
            try:
                agent.reply("start", None, sigfd)
            except AgentError as exc:
                if exc.kind == "agent":
                    self.say(f"error: {exc}. Nothing was started.")
                    return 1
                what = "rejected the rendezvous options" if exc.kind == "usage" else "could not reach"
                self.say(f"error: torch's c10d rendezvous {what} (--rdzv-endpoint {self.endpoint}, --rdzv-conf "
                         f"{','.join(f'{k}={v}' for k, v in self.conf.items()) or '-'}): {exc}. Nothing was started.")
                return 2
        restarts = 0
        failed: int | None = None  # the last failure's exit code, while restarting after it
        rounds = 0
        nlocal = len(self.plan.ranks)
        while True:
            listener = bind_store_socket(self.store_addr, None)
            try:
                with _signals(self.spec.signals) as sigfd:
                    self.say(f"joining the rendezvous at {self.endpoint} (run id {self.run_id}, "
                             f"{self.nodes.min_nodes}-{self.nodes.max_nodes} nodes, {plural(nlocal, 'rank')} here)")
                    rnd = Round.from_json(agent.request(
                        "next", sigfd, nproc=nlocal, host=socket.gethostname(), addr=self.store_addr,
                        port=int(listener.getsockname()[1]),
                    ))
            except AgentError as exc:
                listener.close()
                return self._no_round(exc, rounds, failed)
            except BaseException:
                listener.close()
                raise
            if rnd.group_rank != 0:
                listener.close()  # group rank 0 serves the store; ours would be a private one nobody uses
                listener = bind_store_socket("127.0.0.1", None)
            rounds += 1
            first, last = rnd.rank_offset, rnd.rank_offset + nlocal - 1
            where = ", ".join(f"{h} ({n})" for n, h in rnd.nodes)
            self.say(f"rendezvous round {rnd.number if rnd.number is not None else rounds}: node {rnd.group_rank} of "
                     f"{rnd.nnodes} [{where}], ranks {first}-{last} of world size {rnd.world_size}, store at "
                     f"{rnd.master_addr}:{rnd.master_port}")
            code, result = self._run_round(rnd, listener, restarts, rounds)
            if result is not None and result.restart_reason is not None:
                continue  # a membership change: not a failure, not counted
            if code == 0:
                return self._finish()
            if result is not None and result.stop_signal is not None:
                return code
            if restarts < self.max_restarts:
                restarts += 1
                failed = code
                self.say(f"the local workers failed (exit code {code}); re-joining the rendezvous, restart "
                         f"{restarts} of {self.max_restarts} (TORCHELASTIC_RESTART_COUNT={restarts})")
                continue
            if self.max_restarts:
                self.say(f"no restart left (--max-restarts {self.max_restarts}); closing the rendezvous")
            self._close()
            return code

    def _run_round(
        self, rnd: Round, listener: socket.socket, restarts: int, count: int
    ) -> tuple[int, AttemptResult | None]:
        spec = replace(self.spec, run_id=self.run_id, master_addr=rnd.master_addr, master_port=rnd.master_port,
                       bind_addr=self.store_addr if rnd.group_rank == 0 else "127.0.0.1",
                       max_restarts=self.max_restarts)
        plan = round_plan(self.plan, rnd)
        try:
            base = self.logs()
            if base is not None:
                workdir, temporary = base / f"round_{rnd.number if rnd.number is not None else count}", False
                workdir.mkdir(parents=True, exist_ok=True)
            else:
                workdir, temporary = Path(tempfile.mkdtemp(prefix="ddpboot-")), True
        except BaseException:
            listener.close()
            raise
        kwargs = dict(self.supervisor_kwargs)
        kwargs.setdefault("console", self.console)
        self.watch_broken = False
        # One attempt, numbered as the job's failure restarts so far: a restart needs a new round, so the round
        # never restarts by itself, but TORCHELASTIC_RESTART_COUNT, attempt_N and the summary count the job's.
        sup = Supervisor(
            replace(spec, log_dir=None if temporary else workdir), plan, listener, self.env, workdir, temporary,
            watch=self._watch, watch_interval=WATCH_INTERVAL, attempts=range(restarts, restarts + 1), **kwargs,
        )
        code = sup.run()
        return code, sup.result

    def _watch(self) -> str | None:
        """Called by the Supervisor while workers run: a reason to stop them when a node waits to join."""
        agent = self.agent
        if agent is None or self.watch_broken:
            return None
        try:
            if agent.pending != "waiting":
                agent.send("waiting")
                wait = WATCH_REPLY_WAIT
            else:
                wait = 0.0  # still unanswered from last time: look, do not wait again
            msg = agent.reply("waiting", wait)
        except AgentError as exc:
            if agent.gone:
                return f"the rendezvous agent exited ({exc})"
            self.watch_broken = True
            self.say(f"note: cannot ask the rendezvous for waiting nodes any more ({exc}); the workers keep running")
            return None
        if msg is None:
            return None
        waiting = int(msg.get("waiting", 0))
        if waiting > 0:
            return (f"{plural(waiting, 'node')} waiting to join the rendezvous (a membership change: not counted "
                    "against --max-restarts)")
        return None

    def _finish(self) -> int:
        agent = self.agent
        assert agent is not None
        with _signals(self.spec.signals) as sigfd:
            try:
                agent.request("finish", sigfd, timeout=EXIT_BARRIER + 60, barrier_timeout=EXIT_BARRIER)
            except AgentError as exc:
                self.say(f"note: the workers here succeeded, but the exit barrier with the other nodes failed: {exc}")
            except Stopped as stop:
                return 128 + stop.signo
        return 0

    def _close(self) -> None:
        agent = self.agent
        assert agent is not None
        with contextlib.suppress(AgentError, Stopped), _signals(self.spec.signals) as sigfd:
            agent.request("close", sigfd, timeout=60.0)

    def _no_round(self, exc: AgentError, rounds: int, failed: int | None) -> int:
        """The rendezvous gave no round: the job ended elsewhere, or not enough nodes came."""
        if exc.kind == "graceful":
            self.say(f"the job ran on {self.nodes.max_nodes} nodes (--nnodes MAX) without this one and has ended; "
                     "nothing to do here")
            return 0
        if exc.kind == "closed":
            self.say(f"the rendezvous {self.run_id} at {self.endpoint} is closed: the job has ended on the other "
                     f"nodes{'' if rounds else ', before this node took part'}")
        elif exc.kind == "connect":
            self.say(f"error: lost the rendezvous store at {self.endpoint}: the launcher hosting it (on that machine) "
                     f"has stopped, because the job ended or failed there ({exc})")
        elif exc.kind == "timeout":
            self.say(f"error: fewer than {self.nodes.min_nodes} nodes joined the rendezvous at {self.endpoint} in "
                     f"time ({exc}). Start the other nodes with the same --nnodes, --rdzv-endpoint and --rdzv-id, or "
                     "raise --rdzv-conf join_timeout=SECONDS.")
        else:
            self.say(f"error: the rendezvous at {self.endpoint} failed: {exc}")
        if failed is not None:
            return failed
        return 2 if rounds == 0 and exc.kind == "timeout" else 1  # too few nodes came: nothing was started

