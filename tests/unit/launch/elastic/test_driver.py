"""The rounds of an elastic job (ddpboot.launch.elastic.driver), with a stand-in rendezvous agent and stand-in
supervisors: no process, no torch. What the launcher exits with and says, and what each round's workers are given,
under torchrun's rules: success, failures and restarts, membership changes, no round, stop signals."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpboot.contract import Isolation
from ddpboot.launch.elastic.client import AgentError, Stopped
from ddpboot.launch.elastic.driver import EXIT_BARRIER, run_elastic
from ddpboot.launch.elastic.rounds import Round
from ddpboot.launch.logs import Console
from ddpboot.launch.spec import EndJob, Std
from ddpboot.launch.supervisor import AttemptResult
from ddpboot.nodes.outcome import LOST_CODE
from ddpboot.nodes.static import elastic_setup
from ddpboot.selection.planner import Plan, RankSlot
from tests.support import launch_spec

ENDPOINT = "127.0.0.1:29400"


def a_round(group_rank: int = 0, number: int | None = 3, nnodes: int = 2) -> Round:
    """A round of `nnodes` nodes of 2 ranks each, this node at `group_rank`."""
    return Round(number=number, group_rank=group_rank, nnodes=nnodes, rank_offset=2 * group_rank,
                 world_size=2 * nnodes, master_addr="10.0.0.1", master_port=29500,
                 nodes=tuple((2, f"host{g}") for g in range(nnodes)))


class Messages(Console):
    """A console that keeps the launcher's messages."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def message(self, text: str, stream: Std = Std.ERR) -> None:
        self.lines.append(text)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class FakeAgent:
    """The rendezvous agent: `rounds` are what each "next" gives (a Round, or an exception to raise)."""

    rounds: list[Round | BaseException]
    ready: AgentError | None = None
    waiting: list[int | AgentError | None] = field(default_factory=list)
    gone: bool = False
    closed: bool = False
    close_after: int | None = None  # "waiting" answers before the rendezvous is said to be closed
    calls: list[str] = field(default_factory=list)
    joined: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def wait_ready(self, sigfd: object) -> None:
        self.calls.append("start")
        if self.ready is not None:
            raise self.ready

    def next_round(self, sigfd: object, **fields: Any) -> Round:
        self.calls.append("next")
        self.joined.append(fields)
        outcome = self.rounds.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def nodes_waiting(self) -> int | None:
        if self.close_after is not None:
            self.closed = self.close_after <= 0
            self.close_after -= 1
        answer = self.waiting.pop(0) if self.waiting else 0
        if isinstance(answer, AgentError):
            raise answer
        return answer

    def finish(self, sigfd: object, barrier_timeout: float) -> None:
        self.calls.append(f"finish {barrier_timeout:g}")

    def close_rendezvous(self, sigfd: object) -> None:
        self.calls.append("close")

    def quit(self) -> None:
        self.calls.append("quit")


@dataclass
class FakeSupervisor:
    """One round's workers: `outcome` gets the round's watch callback and gives the round's AttemptResult."""

    outcome: Callable[[Callable[[], str | None]], AttemptResult]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: AttemptResult | None = None
    store_address: tuple[str, int] = ("", 0)  # where the round's store listened

    def run(self) -> int:
        listener = self.args[2]
        self.store_address = listener.getsockname()[:2]
        listener.close()  # as the real Supervisor does when the round ends
        self.result = self.outcome(self.kwargs["watch"].check)
        return self.result.code


class Supervisors:
    """The supervisor factory: each round's workers end as the next of `outcomes` says."""

    def __init__(self, *outcomes: Callable[[Callable[[], str | None]], AttemptResult]) -> None:
        self.outcomes = list(outcomes)
        self.made: list[FakeSupervisor] = []

    def __call__(self, *args: Any, **kwargs: Any) -> FakeSupervisor:
        sup = FakeSupervisor(self.outcomes.pop(0), args, kwargs)
        self.made.append(sup)
        return sup

    @property
    def attempts(self) -> list[range]:
        return [s.kwargs["attempts"] for s in self.made]


def exits(code: int) -> Callable[[Callable[[], str | None]], AttemptResult]:
    return lambda watch: AttemptResult(code=code)


def stopped_by(signo: int) -> Callable[[Callable[[], str | None]], AttemptResult]:
    return lambda watch: AttemptResult(code=128 + signo, stop_signal=signo)


def watched(watch: Callable[[], str | None]) -> AttemptResult:
    """Workers that run until the watch callback gives a reason to stop them (a few polls at most)."""
    for _ in range(5):
        reason = watch()
        if reason is not None:
            return AttemptResult(code=1, restart_reason=reason)
    return AttemptResult(code=0)


@dataclass
class Job:
    agent: FakeAgent
    supervisors: Supervisors
    console: Messages
    code: int = -1


def run_job(agent: FakeAgent, supervisors: Supervisors, tmp_path: Path, max_restarts: int = 0,
            log_dir: bool = True) -> Job:
    spec = launch_spec(run_id="job7",
                       max_restarts=max_restarts, log_dir=tmp_path / "logs" if log_dir else None)
    slots = tuple(RankSlot(rank=i, local_rank=i, gpus=(), cuda_visible_devices="", device="cpu") for i in range(2))
    plan = Plan(ranks=slots, world_size=4, nnodes=2, node_rank=0, isolation=Isolation.RANK, backend="gloo")
    nodes = elastic_setup(1, 2, ENDPOINT, "127.0.0.1")
    console = Messages()

    def start_agent(params: dict[str, Any], env: dict[str, str], console: Console) -> FakeAgent:
        agent.params = params
        return agent

    code = run_elastic(spec, plan, {}, nodes, console=console, start_agent=start_agent, supervisor=supervisors)
    return Job(agent, supervisors, console, code)


def test_a_round_forms_and_the_job_succeeds(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round(group_rank=1)]), Supervisors(exits(0)), tmp_path)
    assert job.code == 0
    assert job.agent.calls == ["start", "next", f"finish {EXIT_BARRIER:g}", "quit"]
    assert job.agent.params == {"endpoint": ENDPOINT, "run_id": "job7", "min_nodes": 1, "max_nodes": 2,
                                "local_addr": "127.0.0.1", "conf": {}}
    assert job.agent.joined[0]["nproc"] == 2 and job.agent.joined[0]["addr"] == "127.0.0.1"
    assert "rendezvous round 3: node 1 of 2 [host0 (2), host1 (2)], ranks 2-3 of world size 4, store at " \
           "10.0.0.1:29500" in job.console.text
    (sup,) = job.supervisors.made
    spec, plan, _listener, _env, where = sup.args
    assert (spec.run_id, spec.master_addr, spec.master_port, spec.bind_addr) == ("job7", "10.0.0.1", 29500,
                                                                                 "127.0.0.1")
    assert [s.rank for s in plan.ranks] == [2, 3] and (plan.world_size, plan.node_rank) == (4, 1)
    assert sup.store_address[0] == "127.0.0.1"  # not group rank 0: a private store nobody uses,
    assert sup.store_address[1] != job.agent.joined[0]["port"]  # not the one offered to the round
    assert where.path == tmp_path / "logs" / "job7" / "round_3" and not where.temporary
    assert sup.kwargs["started_before"] is False and sup.kwargs["console"] is job.console
    assert sup.kwargs["attempts"] == range(0, 1)


def test_a_failure_restarts_while_restarts_remain_then_returns_the_ranks_code(tmp_path: Path) -> None:
    rounds: list[Round | BaseException] = [a_round(number=1), a_round(number=2)]
    job = run_job(FakeAgent(rounds), Supervisors(exits(7), exits(9)), tmp_path, max_restarts=1)
    assert job.code == 9
    assert job.supervisors.attempts == [range(0, 1), range(1, 2)]  # TORCHELASTIC_RESTART_COUNT 0, then 1
    assert "the local workers failed (exit code 7); re-joining the rendezvous, restart 1 of 1 " \
           "(TORCHELASTIC_RESTART_COUNT=1)" in job.console.text
    assert "no restart left (--max-restarts 1); closing the rendezvous" in job.console.text
    assert job.agent.calls == ["start", "next", "next", "close", "quit"]


def test_without_restarts_a_failure_closes_the_rendezvous_quietly(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round()]), Supervisors(exits(7)), tmp_path)
    assert job.code == 7
    assert job.agent.calls == ["start", "next", "close", "quit"]
    assert "re-joining" not in job.console.text and "no restart left" not in job.console.text


def test_a_restart_that_succeeds_ends_the_job_with_0(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round(), a_round()]), Supervisors(exits(7), exits(0)), tmp_path, max_restarts=3)
    assert job.code == 0
    assert job.agent.calls[-2:] == [f"finish {EXIT_BARRIER:g}", "quit"]


def test_a_node_waiting_to_join_restarts_the_workers_without_using_a_restart(tmp_path: Path) -> None:
    agent = FakeAgent([a_round(nnodes=1), a_round(nnodes=2)], waiting=[0, None, 1])
    job = run_job(agent, Supervisors(watched, exits(0)), tmp_path, max_restarts=0)
    assert job.code == 0
    first = job.supervisors.made[0].result
    assert first is not None and first.restart_reason == (
        "1 node waiting to join the rendezvous (a membership change: not counted against --max-restarts)")
    assert job.supervisors.attempts == [range(0, 1), range(0, 1)]  # not counted as a restart
    assert job.agent.calls == ["start", "next", "next", f"finish {EXIT_BARRIER:g}", "quit"]


def test_a_gone_agent_stops_the_workers(tmp_path: Path) -> None:
    agent = FakeAgent([a_round(), AgentError("agent exited", "agent")],
                      waiting=[AgentError("the rendezvous agent exited", "agent")])
    agent.gone = True
    job = run_job(agent, Supervisors(watched), tmp_path)
    result = job.supervisors.made[0].result
    assert result is not None and result.restart_reason is not None
    assert result.restart_reason.startswith("the rendezvous agent exited")
    assert job.code == 1  # then no round forms: the agent is gone


def ended(watch: Callable[[], object]) -> AttemptResult:
    """Workers that run until the watch ends the job (an EndJob): the attempt's code is the EndJob's."""
    for _ in range(5):
        answer = watch()
        if isinstance(answer, EndJob):
            return AttemptResult(code=answer.code, restart_reason=answer.text)
    return AttemptResult(code=0)


def test_a_closed_rendezvous_ends_the_job_here_too(tmp_path: Path) -> None:
    """Another node's job failed for good and closed the rendezvous: this node's round stops at once, and no new
    round is asked for (the job has ended)."""
    agent = FakeAgent([a_round()], close_after=2)
    job = run_job(agent, Supervisors(ended), tmp_path)
    assert job.code == LOST_CODE
    result = job.supervisors.made[0].result
    assert result is not None and "was closed while the workers here ran" in (result.restart_reason or "")
    assert agent.calls == ["start", "next", "quit"]


def test_a_lost_rendezvous_store_ends_the_job_here_too(tmp_path: Path) -> None:
    agent = FakeAgent([a_round()], waiting=[0, AgentError("Connection refused", "connect")])
    job = run_job(agent, Supervisors(ended), tmp_path)
    assert job.code == LOST_CODE
    result = job.supervisors.made[0].result
    assert result is not None and "the rendezvous store at" in (result.restart_reason or "")
    assert "is gone (Connection refused)" in (result.restart_reason or "")


def test_an_agent_that_cannot_say_who_waits_is_no_longer_asked(tmp_path: Path) -> None:
    agent = FakeAgent([a_round()], waiting=[AgentError("handler broke", "other"), 5])
    job = run_job(agent, Supervisors(watched), tmp_path)
    assert job.code == 0
    assert agent.waiting == [5]  # asked once, then not again
    assert "cannot ask the rendezvous for waiting nodes any more (handler broke); the workers keep running" \
           in job.console.text


@pytest.mark.parametrize(
    ("kind", "code", "message"),
    [
        ("graceful", 0, "the job ran on 2 nodes (--nnodes MAX) without this one and has ended; nothing to do here"),
        ("closed", 1, f"the rendezvous job7 at {ENDPOINT} is closed: the job has ended on the other nodes, before "
                      "this node took part"),
        ("connect", 1, f"error: lost the rendezvous store at {ENDPOINT}"),
        ("timeout", 2, f"error: fewer than 1 nodes joined the rendezvous at {ENDPOINT} in time (no round)"),
        ("other", 1, f"error: the rendezvous at {ENDPOINT} failed: no round"),
    ],
)
def test_no_round_forms(kind: str, code: int, message: str, tmp_path: Path) -> None:
    job = run_job(FakeAgent([AgentError("no round", kind)]), Supervisors(), tmp_path)
    assert job.code == code
    assert message in job.console.text
    assert job.supervisors.made == [] and job.agent.calls == ["start", "next", "quit"]
    assert not (tmp_path / "logs").exists()  # nothing started, no log directory


def test_no_round_after_a_failure_returns_the_failures_code(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round(), AgentError("too few", "timeout")]), Supervisors(exits(7)), tmp_path,
                  max_restarts=1)
    assert job.code == 7


@pytest.mark.parametrize(
    ("kind", "code", "message"),
    [
        ("usage", 2, f"error: torch's c10d rendezvous rejected the rendezvous options (--rdzv-endpoint {ENDPOINT}, "
                     "--rdzv-conf -): bad. Nothing was started."),
        ("connect", 2, "error: torch's c10d rendezvous could not reach"),
        ("agent", 1, "error: bad. Nothing was started."),
    ],
)
def test_an_agent_that_cannot_start_the_rendezvous(kind: str, code: int, message: str, tmp_path: Path) -> None:
    job = run_job(FakeAgent([], ready=AgentError("bad", kind)), Supervisors(), tmp_path)
    assert job.code == code
    assert message in job.console.text
    assert job.agent.calls == ["start", "quit"]


def test_a_stop_signal_during_the_rendezvous(tmp_path: Path) -> None:
    job = run_job(FakeAgent([Stopped(signal.SIGTERM)]), Supervisors(), tmp_path)
    assert job.code == 128 + signal.SIGTERM
    assert "SIGTERM while waiting for the rendezvous: stopping" in job.console.text
    assert job.agent.calls == ["start", "next", "quit"]  # the rendezvous is left open, as torchrun does


def test_a_stop_signal_to_the_workers_ends_the_job_without_a_restart(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round()]), Supervisors(stopped_by(signal.SIGINT)), tmp_path, max_restarts=2)
    assert job.code == 128 + signal.SIGINT
    assert job.agent.calls == ["start", "next", "quit"]


def test_group_rank_0_serves_the_store_on_its_address(tmp_path: Path) -> None:
    job = run_job(FakeAgent([a_round(group_rank=0, number=None)]), Supervisors(exits(0)), tmp_path, log_dir=False)
    (sup,) = job.supervisors.made
    spec, plan, _listener, _env, where = sup.args
    assert job.agent.joined[0]["port"] == sup.store_address[1]  # the address published for the round
    assert spec.bind_addr == "127.0.0.1" and [s.rank for s in plan.ranks] == [0, 1]
    assert where.temporary
    assert "rendezvous round 1: node 0 of 2" in job.console.text  # torch's number unknown: this node's count
    where.path.rmdir()


def test_the_listen_queue_note_is_said_once_over_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the store's sockets cannot queue the largest round's burst, the note naming the sysctl is said before
    the first round, not again at each restart."""
    from ddpboot.launch.preflight import ListenQueue

    monkeypatch.setattr("ddpboot.launch.elastic.driver.listen_queue",
                        lambda *args: ListenQueue(1, "raise net.core.somaxconn"))
    rounds: list[Round | BaseException] = [a_round(number=1), a_round(number=2)]
    job = run_job(FakeAgent(rounds), Supervisors(exits(7), exits(0)), tmp_path, max_restarts=1)
    assert job.code == 0
    assert job.console.text.count("note: raise net.core.somaxconn") == 1
