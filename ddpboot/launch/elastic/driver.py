"""The rounds of an elastic job on this node: join a round, run its workers under one Supervisor, and decide what
comes next (the rules are in the package's docstring, launch/elastic/__init__.py).

The driver's collaborators are passed in, the real ones by default: `start_agent` starts the rendezvous agent
(RdzvAgent.start) and `supervisor` runs one round's workers (Supervisor), so the round logic can be exercised with
stand-ins and no process.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ddpboot.launch.elastic.client import AgentError, RdzvAgent, Stopped, signal_reader
from ddpboot.launch.elastic.rounds import Round, round_plan
from ddpboot.launch.logs import Console
from ddpboot.launch.preflight import listen_queue
from ddpboot.launch.procs.signals import SignalFd
from ddpboot.launch.rundir import RunPaths, job_dir
from ddpboot.launch.spec import EndJob, LaunchSpec, RunDir, Watch
from ddpboot.launch.supervisor import AttemptResult, Supervisor
from ddpboot.nodes.check import DEFAULT_JOIN_TIMEOUT
from ddpboot.nodes.outcome import LOST_CODE
from ddpboot.nodes.static import NodeSetup
from ddpboot.selection.planner import Plan

if TYPE_CHECKING:
    from ddpboot.launch.faststart import FastStartProcess
from ddpboot.tcpstore.address import bind_store_socket
from ddpboot.units import plural

WATCH_INTERVAL = 0.5  # seconds between "nodes waiting?" while workers run (torch caches its state for 1 s)
EXIT_BARRIER = 300.0  # torchrun's exit_barrier_timeout


class RendezvousAgent(Protocol):
    """What the driver asks of its rendezvous agent (RdzvAgent in client.py)."""

    @property
    def gone(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def wait_ready(self, sigfd: SignalFd) -> None: ...

    def next_round(
        self, sigfd: SignalFd, *, nproc: int, host: str, addr: str, port: int, notice: str | None = None
    ) -> Round: ...

    def nodes_waiting(self) -> int | None: ...

    def finish(self, sigfd: SignalFd, barrier_timeout: float) -> None: ...

    def close_rendezvous(self, sigfd: SignalFd) -> None: ...

    def quit(self) -> None: ...


class RoundSupervisor(Protocol):
    """One round's workers (a Supervisor running one attempt)."""

    @property
    def result(self) -> AttemptResult | None: ...

    def run(self) -> int: ...


AgentStarter = Callable[[dict[str, Any], dict[str, str], Console], RendezvousAgent]
SupervisorFactory = Callable[..., RoundSupervisor]


def run_elastic(
    spec: LaunchSpec,
    plan: Plan,
    env: dict[str, str],
    nodes: NodeSetup,
    *,
    conf: Mapping[str, str] | None = None,
    fast_start: FastStartProcess | None = None,
    console: Console | None = None,
    start_agent: AgentStarter = RdzvAgent.start,
    supervisor: SupervisorFactory = Supervisor,
) -> int:
    """Run this node's part of an elastic job until it succeeds, fails for good or is stopped; the exit code.
    Everything was checked before (launch/config.py: an elastic range, c10d, an endpoint); the GPUs' locks, if any,
    belong to the caller (the runner), which lets them go after this returns."""
    return ElasticDriver(spec, plan, env, nodes, conf=dict(conf or {}), fast_start=fast_start,
                         console=console or Console(), start_agent=start_agent, supervisor=supervisor).run()


class ElasticDriver:
    """This node's rounds, from the agent's start to the job's end; `run()` gives the launcher's exit code. The job's
    run id (the rendezvous id), restarts, log directory and log mode are the spec's."""

    def __init__(
        self,
        spec: LaunchSpec,
        plan: Plan,
        env: dict[str, str],
        nodes: NodeSetup,
        *,
        conf: dict[str, str],
        fast_start: FastStartProcess | None,
        console: Console,
        start_agent: AgentStarter,
        supervisor: SupervisorFactory,
    ) -> None:
        if not nodes.elastic or nodes.rdzv_endpoint is None:
            raise ValueError("ddpboot bug: the elastic driver was given a node setup that is not an elastic range")
        self.spec, self.plan, self.env, self.nodes = spec, plan, env, nodes
        self.endpoint = nodes.rdzv_endpoint
        self.run_id = spec.run_id
        self.conf = conf
        self.max_restarts = spec.max_restarts
        self.fast_start = fast_start
        self.console = console
        self.start_agent = start_agent
        self.supervisor = supervisor
        self.store_addr = nodes.master_addr
        self.agent: RendezvousAgent | None = None
        self.watch_broken = False  # the agent cannot say whether nodes wait: stop asking
        self.base: Path | None = None
        self.queue_noted = False  # the listen-queue note is said once, not every round
        self.ended: str | None = None  # why the job ended on another node while a round ran here

    def say(self, text: str) -> None:
        self.console.message(f"ddpboot: {text}")

    def run(self) -> int:
        params = {"endpoint": self.endpoint, "run_id": self.run_id, "min_nodes": self.nodes.min_nodes,
                  "max_nodes": self.nodes.max_nodes, "local_addr": self.store_addr, "conf": self.conf}
        agent = self.agent = self.start_agent(params, self.env, self.console)
        try:
            code = self._start(agent)
            return code if code is not None else self._rounds(agent)
        except Stopped as stop:
            self.say(f"{stop} while waiting for the rendezvous: stopping")
            return 128 + stop.signo
        finally:
            agent.quit()

    def _notice(self) -> str:
        """What a long wait for the next round says (once, after a few seconds)."""
        timeout = self.conf.get("join_timeout", f"{DEFAULT_JOIN_TIMEOUT:g}")
        return (f"waiting for {self.nodes.min_nodes} to {self.nodes.max_nodes} nodes at the rendezvous "
                f"{self.endpoint} (run id {self.run_id}), for up to {timeout} s (--rdzv-conf join_timeout=SECONDS); "
                "Ctrl-C (SIGINT) or SIGTERM ends the wait")

    def _start(self, agent: RendezvousAgent) -> int | None:
        """None once the agent holds torch's rendezvous handler; otherwise the exit code (nothing was started)."""
        with signal_reader(self.spec.signals) as sigfd:
            try:
                agent.wait_ready(sigfd)
            except AgentError as exc:
                if exc.kind == "agent":
                    self.say(f"error: {exc}. Nothing was started.")
                    return 1
                what = "rejected the rendezvous options" if exc.kind == "usage" else "could not reach"
                conf = ",".join(f"{k}={v}" for k, v in self.conf.items()) or "-"
                self.say(f"error: torch's c10d rendezvous {what} (--rdzv-endpoint {self.endpoint}, --rdzv-conf "
                         f"{conf}): {exc}. Nothing was started.")
                return 2
        return None

    def _rounds(self, agent: RendezvousAgent) -> int:
        """Rounds until the job succeeds, fails for good or is stopped: torchrun's rules (package docstring)."""
        restarts = 0
        failed: int | None = None  # the last failure's exit code, while restarting after it
        rounds = 0
        while True:
            try:
                rnd, listener = self._join(agent)
            except AgentError as exc:
                return self._no_round(exc, rounds, failed)
            rounds += 1
            code, result = self._run_round(rnd, listener, restarts, rounds)
            if self.ended is not None:  # the job ended on another node while this round ran
                return code
            if result is not None and result.restart_reason is not None:
                continue  # a membership change: not a failure, not counted
            if code == 0:
                return self._finish(agent)
            if result is not None and result.stop_signal is not None:
                return code
            if restarts >= self.max_restarts:
                return self._give_up(agent, code)
            restarts += 1
            failed = code
            self.say(f"the local workers failed (exit code {code}); re-joining the rendezvous, restart "
                     f"{restarts} of {self.max_restarts} (TORCHELASTIC_RESTART_COUNT={restarts})")

    def _join(self, agent: RendezvousAgent) -> tuple[Round, socket.socket]:
        """Join the next round; with it, the listening socket of the workers' store this node serves in that round
        (group rank 0's on --local-addr; elsewhere a private loopback one that nobody uses)."""
        nlocal = len(self.plan.ranks)
        # sized for the largest round: this node may become group rank 0 and serve every rank of max_nodes
        most = self.nodes.max_nodes or 1
        queue = listen_queue(nlocal * most, most, self.spec.store)
        if queue.note is not None and not self.queue_noted:
            self.queue_noted = True
            self.say(f"note: {queue.note}")
        listener = bind_store_socket(self.store_addr, None, listeners=queue.sockets)
        try:
            with signal_reader(self.spec.signals) as sigfd:
                self.say(f"joining the rendezvous at {self.endpoint} (run id {self.run_id}, "
                         f"{self.nodes.min_nodes}-{self.nodes.max_nodes} nodes, {plural(nlocal, 'rank')} here)")
                rnd = agent.next_round(sigfd, nproc=nlocal, host=socket.gethostname(), addr=self.store_addr,
                                       port=int(listener.getsockname()[1]), notice=self._notice())
        except BaseException:
            listener.close()
            raise
        if rnd.group_rank != 0:
            listener.close()
            listener = bind_store_socket("127.0.0.1", None)
        return rnd, listener

    def _run_round(
        self, rnd: Round, listener: socket.socket, restarts: int, count: int
    ) -> tuple[int, AttemptResult | None]:
        """Run the round's workers (`count`: this node's rounds so far, this one included); the exit code and what
        ended them."""
        first, last = rnd.rank_offset, rnd.rank_offset + len(self.plan.ranks) - 1
        where = ", ".join(f"{h} ({n})" for n, h in rnd.nodes)
        self.say(f"rendezvous round {rnd.label(count)}: node {rnd.group_rank} of {rnd.nnodes} [{where}], ranks "
                 f"{first}-{last} of world size {rnd.world_size}, store at {rnd.master_addr}:{rnd.master_port}")
        spec = replace(self.spec, master_addr=rnd.master_addr, master_port=rnd.master_port,
                       bind_addr=self.store_addr if rnd.group_rank == 0 else "127.0.0.1")
        try:
            workdir = self._workdir(rnd, count)
        except BaseException:
            listener.close()
            raise
        self.watch_broken = False
        # One attempt, numbered as the job's failure restarts so far: a restart needs a new round, so the round
        # never restarts by itself, but TORCHELASTIC_RESTART_COUNT, attempt_N and the summary count the job's.
        sup = self.supervisor(
            spec, round_plan(self.plan, rnd), listener, self.env, workdir,
            watch=Watch(self._watch, WATCH_INTERVAL), attempts=range(restarts, restarts + 1),
            started_before=count > 1, fast_start=self.fast_start, console=self.console,
        )
        code = sup.run()
        return code, sup.result

    def _workdir(self, rnd: Round, count: int) -> RunDir:
        """The round's directory under the job's logs, or a temporary one without --log-dir."""
        if self.base is None:  # DIR/RUN_ID (made unique), created when the first round starts
            where = job_dir(self.spec.log_dir, self.run_id, self.spec.log_mode)
            if where.temporary:  # no --log-dir: a temporary one per round (its supervisor removes it)
                return where
            self.base = where.path
            self.say(f"logs in {self.base}")
        workdir = RunPaths(self.base).round(rnd.label(count)).root
        workdir.mkdir(parents=True, exist_ok=True)
        return RunDir(workdir, False)

    def _watch(self) -> str | EndJob | None:
        """Called by the Supervisor while workers run: a reason to stop them when a node waits to join."""
        agent = self.agent
        if agent is None or self.watch_broken:
            return None
        try:
            waiting = agent.nodes_waiting()
        except AgentError as exc:
            if agent.gone:
                return f"the rendezvous agent exited ({exc})"
            if exc.kind == "connect":  # the launcher that hosts the rendezvous stopped: the job ended there
                return self._end(f"the rendezvous store at {self.endpoint} is gone ({exc}): the launcher that hosts "
                                 "it stopped, because the job ended or failed there")
            self.watch_broken = True
            self.say(f"note: cannot ask the rendezvous for waiting nodes any more ({exc}); the workers keep running")
            return None
        if agent.closed:
            return self._end(f"the rendezvous at {self.endpoint} was closed while the workers here ran: the job "
                             "failed for good on another node (its launcher says why)")
        if waiting is None or waiting <= 0:
            return None
        return (f"{plural(waiting, 'node')} waiting to join the rendezvous (a membership change: not counted "
                "against --max-restarts)")

    def _end(self, why: str) -> EndJob:
        """The job ended on another node: this round's workers stop, and the job with them (no new round)."""
        self.ended = why
        return EndJob(LOST_CODE, f"ddpboot: {why}; stopping this node's ranks (exit code {LOST_CODE})")

    def _finish(self, agent: RendezvousAgent) -> int:
        """The workers here succeeded: torchrun's exit barrier with the other nodes, then exit 0."""
        with signal_reader(self.spec.signals) as sigfd:
            try:
                agent.finish(sigfd, EXIT_BARRIER)
            except AgentError as exc:
                self.say(f"note: the workers here succeeded, but the exit barrier with the other nodes failed: {exc}")
            except Stopped as stop:
                return 128 + stop.signo
        return 0

    def _give_up(self, agent: RendezvousAgent, code: int) -> int:
        """No restart left: close the rendezvous, so that the other nodes stop too; exit with the workers' code."""
        if self.max_restarts:
            self.say(f"no restart left (--max-restarts {self.max_restarts}); closing the rendezvous")
        with contextlib.suppress(AgentError, Stopped), signal_reader(self.spec.signals) as sigfd:
            agent.close_rendezvous(sigfd)
        return code

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
