"""The supervisor's rules on a fake clock: no process, no sleep. Times are plain numbers passed as `now`."""

from __future__ import annotations

import math
import signal

from ddpboot.contract import STACKS_SIGNAL
from ddpboot.launch.observe.base import End, Restart, Stalled
from ddpboot.launch.procs.signals import REPEAT_WINDOW, ForwardPolicy, SignalInfo
from ddpboot.launch.spec import EndJob
from ddpboot.launch.supervisor.decisions import (
    EXITING_GRACE,
    LINGER,
    STUCK_REPORT,
    AttemptDecisions,
    AttemptOutcome,
    DumpStacks,
    ReportStuck,
    Say,
    SignalGroups,
    Timing,
    after_attempt,
    job_code,
)

TIMEOUT = 30.0
USER_PID = 4242


def decisions(n: int = 3, timeout: float = TIMEOUT, marks: dict[int, float] | None = None,
              now: float = 0.0) -> AttemptDecisions:
    marks = marks if marks is not None else {}
    return AttemptDecisions(list(range(n)), Timing(timeout, 0.1), now, ForwardPolicy(),
                            lambda i: marks.get(i, math.inf))


def signalled(actions: list[object]) -> list[tuple[tuple[int, ...], int]]:
    return [(a.workers, a.signo) for a in actions if isinstance(a, SignalGroups)]


def said(actions: list[object]) -> str:
    return "\n".join(a.text for a in actions if isinstance(a, Say))


def all_gone(d: AttemptDecisions) -> None:
    for i in range(len(d.ranks)):
        d.group_gone(i)


# --- fail-fast ----------------------------------------------------------------------------------------


def test_the_first_failure_stops_every_group_with_sigterm() -> None:
    d = decisions()
    assert signalled(d.workers_exited([(1, 0)], 5.0)) == []  # a success stops nothing
    d.group_gone(1)
    actions = d.workers_exited([(2, 7)], 10.0)
    assert signalled(actions) == [((0, 2), signal.SIGTERM)]
    assert d.root == 2 and d.stopping
    assert d.workers_exited([(0, 143)], 11.0) == []  # a consequence, not a second root cause
    d.group_gone(0)
    d.group_gone(2)
    assert d.done and d.exit_code() == 7
    assert d.ranks[0].sent == ["SIGTERM (rank 2 failed)"] and d.ranks[1].sent == []


def test_sigkill_comes_exactly_after_the_shutdown_timeout() -> None:
    d = decisions(n=2)
    d.workers_exited([(0, 1)], 10.0)
    assert d.wait_time(10.0) == 0.1  # rank 0's group has not emptied yet: ticks
    d.group_gone(0)
    assert d.wait_time(10.0) == TIMEOUT
    assert signalled(d.tick(10.0 + TIMEOUT - 0.001)) == []
    actions = d.tick(10.0 + TIMEOUT)
    assert signalled(actions) == [((1,), signal.SIGKILL)]
    assert d.ranks[1].sent == ["SIGTERM (rank 0 failed)", f"SIGKILL after {TIMEOUT:g} s"]
    assert signalled(d.tick(10.0 + TIMEOUT + 1)) == []  # once
    assert not any(isinstance(a, ReportStuck) for a in d.tick(10.0 + TIMEOUT + STUCK_REPORT - 0.001))
    assert [a for a in d.tick(10.0 + TIMEOUT + STUCK_REPORT) if isinstance(a, ReportStuck)] == [ReportStuck()]


def test_a_shorter_shutdown_timeout_is_honoured() -> None:
    d = decisions(n=2, timeout=2.5)
    d.workers_exited([(0, 1)], 10.0)
    assert signalled(d.tick(12.4)) == []
    assert signalled(d.tick(12.5)) == [((0, 1), signal.SIGKILL)]


# --- the root cause -----------------------------------------------------------------------------------


def test_without_an_exit_mark_the_first_failure_is_the_root_cause() -> None:
    d = decisions(n=2)
    d.workers_exited([(1, 1)], 10.0)
    d.workers_exited([(0, 3)], 10.5)
    assert d.root == 1 and d.exit_code() == 1


def test_the_rank_that_began_to_exit_first_is_the_root_cause() -> None:
    d = decisions(n=2, marks={0: 9.0})  # rank 0 began to exit (its mark), then rank 1 died of it
    assert d.workers_exited([(1, 1)], 10.0) == []  # nobody is signalled while the verdict waits
    d.group_gone(1)
    assert d.root is None and d.wait_time(10.0) == min(EXITING_GRACE, TIMEOUT)
    assert d.resolve_root(10.2) == []
    d.workers_exited([(0, 3)], 10.3)
    actions = d.resolve_root(10.3)
    assert d.root == 0 and signalled(actions) == [((0,), signal.SIGTERM)]
    assert d.exit_code() == 3


def test_a_leaving_rank_that_never_exits_leaves_the_verdict_to_the_grace() -> None:
    d = decisions(n=2, timeout=2.0, marks={0: 9.0})
    d.workers_exited([(1, 1)], 10.0)
    assert d.resolve_root(11.99) == []  # the grace is at most the shutdown timeout
    assert signalled(d.resolve_root(12.0)) == [((0, 1), signal.SIGTERM)]
    assert d.root == 1


def test_a_leaving_rank_that_exits_cleanly_leaves_the_root_cause_to_the_failure() -> None:
    d = decisions(n=2, marks={0: 9.0})
    d.workers_exited([(1, 1)], 10.0)
    d.workers_exited([(0, 0)], 10.1)
    d.resolve_root(10.1)
    assert d.root == 1 and d.exit_code() == 1


def test_failures_reaped_together_are_ordered_by_their_marks() -> None:
    d = decisions(n=2, marks={0: 5.0, 1: 4.0})
    d.workers_exited([(0, 1), (1, 2)], 10.0)
    d.resolve_root(10.0)
    assert d.root == 1 and d.exit_code() == 2


# --- restarts ---------------------------------------------------------------------------------------------


def run_job(codes: list[int], attempts: range) -> tuple[int, list[int]]:
    """The supervisor's attempt loop, with attempt i ending with codes[i]: (the job's code, attempts run)."""
    ran = []
    outcome = AttemptOutcome(attempts.start, 1)
    for attempt in attempts:
        ran.append(attempt)
        outcome = AttemptOutcome(attempt, codes[attempt - attempts.start])
        if after_attempt(outcome, attempts) == "finish":
            break
    return job_code(outcome), ran


def test_failures_restart_until_the_attempts_run_out_and_the_last_code_counts() -> None:
    assert run_job([1, 4, 2], range(3)) == (2, [0, 1, 2])
    assert run_job([1, 0, 9], range(3)) == (0, [0, 1])
    assert run_job([5], range(1)) == (5, [0])
    assert run_job([6], range(2, 3)) == (6, [2])  # an elastic round: one attempt, numbered as the job's


def test_a_stop_signal_a_dead_guardian_or_the_watch_hook_end_the_job() -> None:
    attempts = range(5)
    assert after_attempt(AttemptOutcome(0, 143, stopped_by_signal=True), attempts) == "finish"
    assert after_attempt(AttemptOutcome(0, 1, restart_reason="a node waits to join"), attempts) == "finish"
    died = AttemptOutcome(0, 0, guardian_died=True)
    assert after_attempt(died, attempts) == "finish" and job_code(died) == 1
    assert after_attempt(AttemptOutcome(0, 1), attempts) == "restart"


# --- signals ------------------------------------------------------------------------------------------------


def sig(signo: int, pid: int = USER_PID) -> SignalInfo:
    return SignalInfo(signo, 0, pid)


def test_a_users_sigterm_is_forwarded_and_stops_the_job() -> None:
    d = decisions(n=2)
    actions = d.signal_received(sig(signal.SIGTERM), 1.0, "bash", from_worker=False)
    assert signalled(actions) == [((0, 1), signal.SIGTERM)]  # forwarded once, no second SIGTERM
    assert f"received SIGTERM from pid {USER_PID} (bash)" in said(actions)
    assert d.stopping and d.stop_signal == signal.SIGTERM
    assert d.ranks[0].sent == ["SIGTERM (forwarded)", "SIGTERM to the launcher"]
    d.workers_exited([(0, 143), (1, 143)], 2.0)
    all_gone(d)
    assert d.root is None and d.exit_code() == 128 + signal.SIGTERM


def test_slurmstepds_sigterm_is_not_forwarded_but_still_stops_the_job() -> None:
    d = decisions(n=2)
    actions = d.signal_received(sig(signal.SIGTERM), 1.0, "slurmstepd", from_worker=False)
    assert signalled(actions) == []  # each worker has it from slurmstepd already
    assert "not forwarded" in said(actions) and d.stopping
    assert signalled(d.tick(1.0 + TIMEOUT)) == [((0, 1), signal.SIGKILL)]


def test_a_signal_from_a_worker_is_not_echoed_but_the_others_are_stopped() -> None:
    d = decisions(n=2)
    actions = d.signal_received(sig(signal.SIGTERM), 1.0, "python", from_worker=True)
    assert signalled(actions) == [((0, 1), signal.SIGTERM)]
    assert d.ranks[0].sent == ["SIGTERM to the launcher"]  # our own stop, not a forward


def test_a_repeat_within_the_window_is_forwarded_once() -> None:
    d = decisions(n=2)
    assert signalled(d.signal_received(sig(signal.SIGUSR1), 1.0, "bash", False)) == [((0, 1), signal.SIGUSR1)]
    repeat = d.signal_received(sig(signal.SIGUSR1), 1.0 + REPEAT_WINDOW / 2, "bash", False)
    assert signalled(repeat) == [] and "not forwarded twice" in said(repeat)
    later = d.signal_received(sig(signal.SIGUSR1), 1.0 + REPEAT_WINDOW * 2, "bash", False)
    assert signalled(later) == [((0, 1), signal.SIGUSR1)]
    assert not d.stopping and d.stop_signal is None  # SIGUSR1 is only forwarded


def test_a_second_sigint_kills_at_once() -> None:
    d = decisions(n=2)
    first = d.signal_received(sig(signal.SIGINT, pid=0), 1.0, None, False)
    assert signalled(first) == [((0, 1), signal.SIGINT)]
    assert "from the terminal or the kernel" in said(first)
    second = d.signal_received(sig(signal.SIGINT, pid=0), 1.2, None, False)
    assert signalled(second) == [((0, 1), signal.SIGKILL)]
    assert "second SIGINT" in said(second)
    # "Now": no shutdown timeout left to wait, and no stack dump claiming the ranks outlived it.
    assert d.tick(1.2) == [] and d.wait_time(1.2) == STUCK_REPORT
    assert d.tick(1.2 + STUCK_REPORT) == [ReportStuck()]
    assert d.exit_code() == 128 + signal.SIGINT


def test_ten_sigints_kill_once_and_never_dump() -> None:
    d = decisions(n=2)
    actions = [a for i in range(10) for a in d.signal_received(sig(signal.SIGINT, pid=0), 1.0 + i / 10, None, False)]
    assert signalled(actions)[:2] == [((0, 1), signal.SIGINT), ((0, 1), signal.SIGKILL)]
    assert not any(isinstance(a, DumpStacks) for a in actions + d.tick(2.0) + d.tick(100.0))
    assert d.exit_code() == 128 + signal.SIGINT


def test_a_stop_signal_after_every_rank_exited_keeps_their_code_and_hurries() -> None:
    d = decisions(n=2)
    d.workers_exited([(0, 0), (1, 0)], 1.0)
    actions = d.signal_received(sig(signal.SIGINT, pid=0), 2.0, None, False)
    assert ((0, 1), signal.SIGKILL) in signalled(actions)  # what remains in their groups: no grace
    assert d.policy.hurried and d.stop_signal is None and d.exit_code() == 0
    assert not any(isinstance(a, DumpStacks) for a in actions + d.tick(2.0))


def test_a_failure_before_a_signal_keeps_the_failures_code() -> None:
    d = decisions(n=2)
    d.workers_exited([(0, 3)], 1.0)
    d.signal_received(sig(signal.SIGTERM), 2.0, "bash", False)
    assert d.stop_signal is None and d.exit_code() == 3


# --- the end of an attempt ------------------------------------------------------------------------------


def test_leftover_processes_get_the_linger_then_sigterm() -> None:
    d = decisions(n=2)
    d.workers_exited([(0, 0), (1, 0)], 10.0)
    d.group_gone(0)
    assert d.linger(10.0) == [] and d.wait_time(10.0) == 0.1  # ticks while a group empties
    assert d.linger(10.0 + LINGER - 0.01) == []
    actions = d.linger(10.0 + LINGER)
    assert signalled(actions) == [((1,), signal.SIGTERM)]
    assert "process group of rank 1: sending SIGTERM" in said(actions)
    assert signalled(d.tick(10.0 + LINGER + TIMEOUT)) == [((1,), signal.SIGKILL)]
    d.group_gone(1)
    assert d.done and d.exit_code() == 0


def test_the_watch_hooks_restart_stops_the_attempt_for_a_restart() -> None:
    d = decisions(n=2)
    assert d.answered([], 1.0) == []
    actions = d.answered([Restart("a node waits to join")], 2.0)
    assert signalled(actions) == [((0, 1), signal.SIGTERM)] and "a node waits to join; stopping every rank" in said(
        actions)
    assert d.restart_reason == "a node waits to join" and d.exit_code() == 0
    assert d.answered([Restart("another")], 3.0) == [] and d.restart_reason == "a node waits to join"


def test_another_nodes_failure_ends_the_attempt_with_its_code() -> None:
    d = decisions(n=2)
    actions = d.answered([EndJob(7, "ddpboot: node 1 failed")], 1.0)
    assert said(actions) == "ddpboot: node 1 failed" and signalled(actions) == [((0, 1), signal.SIGTERM)]
    d.workers_exited([(0, 143), (1, 143)], 2.0)
    assert d.exit_code() == 7 and d.restart_reason == "ddpboot: node 1 failed"


def test_an_observers_end_stops_the_attempt_with_its_code_and_only_the_first_answer_counts() -> None:
    d = decisions(n=2)
    actions = d.answered([End(125, "--gpu-watch strict"), End(3, "another")], 1.0)
    assert signalled(actions) == [((0, 1), signal.SIGTERM)] and said(actions) == ""
    d.workers_exited([(0, 143), (1, 143)], 2.0)
    assert d.exit_code() == 125 and d.restart_reason is None


def test_observers_deadlines_are_the_loops() -> None:
    d = decisions(n=2)
    assert d.wait_time(10.0, due=[12.5, 11.0]) == 1.0
    assert d.wait_time(10.0, due=[9.0]) == 0.0  # overdue: no waiting


def test_a_dead_guardian_stops_the_job_with_code_1() -> None:
    d = decisions(n=2)
    assert d.tick(1.0) == []
    d.guardian_died(1)
    actions = d.tick(2.0)
    assert signalled(actions) == [((0, 1), signal.SIGTERM)] and "store server" in said(actions)
    d.workers_exited([(0, 0), (1, 0)], 3.0)
    assert d.exit_code() == 1


def test_without_deadlines_the_loop_waits_for_events() -> None:
    d = decisions(n=2)
    assert d.wait_time(0.0) is None
    assert d.wait_time(0.0, silent_worker=True) == 0.1


# --- stack dumps and --stall-timeout ---------------------------------------------------------------------


def dumps(actions: list[object]) -> list[str]:
    return [a.reason for a in actions if isinstance(a, DumpStacks)]


def test_the_stacks_signal_dumps_and_is_neither_forwarded_nor_a_stop() -> None:
    d = decisions()
    actions = d.signal_received(SignalInfo(STACKS_SIGNAL, 0, USER_PID), 1.0, "bash", False)
    assert dumps(actions) == [f"SIGUSR2 from pid {USER_PID} (bash)"]
    assert signalled(actions) == [] and not d.stopping
    assert "not forwarded" in said(actions)


def test_the_stacks_signal_is_forwarded_when_the_signals_option_lists_it() -> None:
    d = AttemptDecisions([0, 1], Timing(TIMEOUT, 0.1), 0.0, ForwardPolicy(forward_stacks=True), lambda i: math.inf)
    actions = d.signal_received(SignalInfo(STACKS_SIGNAL, 0, USER_PID), 1.0, "bash", False)
    assert dumps(actions) == [] and signalled(actions) == [((0, 1), STACKS_SIGNAL)]


def test_slurm_sigterm_dumps_first_and_its_sigusr2_is_left_alone() -> None:
    d = decisions()
    actions = d.signal_received(SignalInfo(signal.SIGUSR2, 0, USER_PID), 1.0, "slurmstepd", False)
    assert dumps(actions) == [] and signalled(actions) == []
    actions = d.signal_received(SignalInfo(signal.SIGTERM, 0, USER_PID), 2.0, "slurmstepd", False)
    assert dumps(actions) and d.stopping
    assert dumps(d.tick(2.0 + TIMEOUT)) == []  # dumped once while stopping: not again before SIGKILL


def test_ranks_still_running_at_the_kill_deadline_are_dumped_before_sigkill() -> None:
    d = decisions(n=3)
    d.workers_exited([(1, 5)], 1.0)  # rank 1 fails: the others get SIGTERM
    d.workers_exited([(0, 143)], 2.0)  # rank 0 goes; rank 2 ignores SIGTERM
    actions = d.tick(1.0 + TIMEOUT)
    assert dumps(actions) == [f"rank 2 still running {TIMEOUT:g} s after being asked to stop"]
    kinds = [type(a).__name__ for a in actions]
    assert kinds.index("DumpStacks") < kinds.index("SignalGroups")
    assert signalled(actions) == [((0, 1, 2), signal.SIGKILL)]  # every group not seen empty


def test_no_dump_at_the_kill_deadline_when_every_rank_has_exited() -> None:
    d = decisions(n=2)
    d.workers_exited([(0, 5)], 1.0)
    d.workers_exited([(1, 143)], 2.0)
    assert dumps(d.tick(1.0 + TIMEOUT)) == []


def test_a_stall_dumps_and_stops_the_job_once() -> None:
    d = AttemptDecisions([0, 1], Timing(3.0, 0.1), 0.0, ForwardPolicy(), lambda i: math.inf)
    actions = d.answered([Stalled(10.0, "no output, no rank exited, no rank busy on a CPU")], 12.0)
    assert dumps(actions) == ["no progress for 10 s, --stall-timeout"]
    assert said(actions).startswith("ddpboot: no progress for 10 s (no output, no rank exited, no rank busy on a CPU): "
                                    "--stall-timeout 10; dumping every rank's stack, then stopping the job")
    assert signalled(actions) == [((0, 1), signal.SIGTERM)] and d.stalled
    assert dumps(d.tick(12.0 + 3.0)) == []  # SIGKILL follows without a second dump
    assert d.answered([Stalled(10.0, "again")], 16.0) == []
