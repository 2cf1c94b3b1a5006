"""why.explain: every signal it speaks of, with each piece of evidence present and absent, and the order in which
the evidence is weighed."""

from __future__ import annotations

import itertools
import signal
import time

import pytest

from ddpboot.launch.observe.memcg import Counters
from ddpboot.launch.observe.why import CRASHES, ENDINGS, OOM_FIX, Death, explain

GIB = 1 << 30
AT = 1_700_000_000.0
CLOCK = time.strftime("%H:%M:%S", time.localtime(AT))


def chain(kills: int | None, limit: int | None = int(1.4 * GIB), parent_limit: int | None = None,
          version: int = 2) -> tuple[Counters, ...]:
    return (Counters("/job/step", version, kills, limit, int(1.4 * GIB) if limit else None),
            Counters("/job", version, kills, parent_limit, None))


def death(signo: int = signal.SIGKILL, **changes: object) -> Death:
    base: dict[str, object] = {"rank": 1, "signo": signo, "at": AT, "before": chain(0), "after": chain(0)}
    return Death(**{**base, **changes})  # type: ignore[arg-type]


def test_an_oom_kill_counted_in_the_rank_s_cgroup_names_its_limit_peak_and_the_fix() -> None:
    v = explain(death(after=chain(1), peak_rss=int(1.2 * GIB), node_rss=int(1.4 * GIB), ranks_on_node=2))
    assert v is not None and v.tag == "the kernel's OOM killer"
    assert v.text == (f"rank 1 was killed by the kernel's OOM killer at {CLOCK}: its memory cgroup /job/step was full "
                      "(limit 1.4 GiB, peak 1.4 GiB, oom_kill 0 → 1: memory.max, memory.peak, memory.events); rank 1 "
                      "held 1.2 GiB at its peak when last sampled, the node's 2 ranks 1.4 GiB. " + OOM_FIX)


def test_v1_names_its_own_files_and_a_limit_set_above_the_rank_s_cgroup_is_named_as_such() -> None:
    v = explain(death(before=chain(0, None, GIB, 1), after=chain(2, None, GIB, 1)))
    assert v is not None
    assert ("the memory cgroup above its own, /job was full (limit 1.0 GiB, oom_kill 0 → 2: memory.limit_in_bytes, "
            "memory.max_usage_in_bytes, memory.oom_control)") in v.text


def test_an_oom_kill_without_any_limit_is_the_node_s_memory() -> None:
    v = explain(death(before=chain(0, None), after=chain(1, None)))
    assert v is not None and "the node's memory was full (its memory cgroup has no limit)" in v.text


def test_the_kernel_log_s_line_alone_is_enough_and_its_absence_is_said() -> None:
    line = "Memory cgroup out of memory: Killed process 7 (python) anon-rss:1282256kB"
    v = explain(death(before=None, after=None, kernel_line=line))
    assert v is not None and v.tag == "the kernel's OOM killer" and f"The kernel logged: {line}." in v.text
    unread = explain(death(after=chain(1), kernel_unread="the kernel log cannot be read (/dev/kmsg: denied)"))
    assert unread is not None and ". The kernel log cannot be read (/dev/kmsg: denied)." in unread.text


def test_ddpboot_s_own_sigkill_is_named_unless_the_oom_killer_came_first() -> None:
    v = explain(death(sent=("SIGTERM (rank 0 failed)", "SIGKILL (shutdown timeout)")))
    assert v is not None and v.tag == "by ddpboot"
    assert v.text == "rank 1 was killed by ddpboot, which sent it SIGTERM (rank 0 failed), SIGKILL (shutdown timeout)"
    both = explain(death(after=chain(1), sent=("SIGTERM (rank 0 failed)",)))
    assert both is not None and both.tag == "the kernel's OOM killer"


@pytest.mark.parametrize(("used", "told"), [(29.5, True), (10.0, False), (None, False)])
def test_a_sigkill_at_the_hard_cpu_time_limit(used: float | None, told: bool) -> None:
    v = explain(death(cpu_limit=(20.0, 30.0), cpu_used=used))
    assert v is not None and (v.tag == "its CPU-time limit") is told
    if told:
        assert "at its hard CPU-time limit (ulimit -Ht 30 s; it had used 30 s of CPU" in v.text


def test_an_oom_kill_counted_on_the_node_only_is_probable_where_the_cgroup_was_not_recorded() -> None:
    v = explain(death(before=None, after=None, node_ooms=(3, 4)))
    assert v is not None and v.tag == "probably the kernel's OOM killer" and "the node counted 1 OOM kill" in v.text
    other = explain(death(node_ooms=(3, 4)))  # its cgroup counted none: another process was the victim
    assert other is not None and other.tag == "cannot tell"
    assert "the node counted an OOM kill of another process" in other.text


def test_a_sigkill_nothing_explains_says_what_was_looked_at_and_that_it_cannot_tell() -> None:
    v = explain(death())
    assert v is not None and v.tag == "cannot tell"
    assert v.text == (f"rank 1 was killed by SIGKILL from outside the job at {CLOCK}; ddpboot did not send it, its "
                      "memory cgroup /job/step counted no OOM kill (oom_kill 0 → 0): cannot tell who sent it (a user's "
                      "kill -9, a scheduler, a watchdog)")
    blind = explain(death(before=None, after=None, node_ooms=(None, None)))
    assert blind is not None and "its memory cgroup was not recorded: cannot tell" in blind.text


def test_sigxcpu_names_the_limit_or_says_none_was_recorded() -> None:
    v = explain(death(signal.SIGXCPU, cpu_limit=(12.0, 42.0), cpu_used=11.6))
    assert v is not None and v.text == ("rank 1 reached its CPU-time limit (ulimit -t 12 s, hard 42 s); it had used "
                                        "12 s of CPU at the last sample. Raise the limit (ulimit -t, the scheduler's "
                                        "CPU-time limit)")
    soft_only = explain(death(signal.SIGXCPU, cpu_limit=(12.0, None)))
    assert soft_only is not None and "(ulimit -t 12 s)." in soft_only.text
    for unknown in (None, (None, None)):
        v = explain(death(signal.SIGXCPU, cpu_limit=unknown))
        assert v is not None and "cannot tell which, none was recorded at its start" in v.text


@pytest.mark.parametrize(("signo", "traceback"), list(itertools.product(CRASHES, (True, False))))
def test_a_crash_keeps_its_traceback_or_says_how_to_get_one(signo: signal.Signals, traceback: bool) -> None:
    v = explain(death(signo, traceback=traceback))
    assert v is not None and v.tag == "a crash" and f"crashed with {signo.name}, {CRASHES[signo]}" in v.text
    assert ("faulthandler traceback is in its output above" in v.text) is traceback
    assert ("PYTHONFAULTHANDLER=1" in v.text) is not traceback


@pytest.mark.parametrize("signo", ENDINGS)
def test_an_ending_signal_is_ddpboot_s_or_another_process_s(signo: signal.Signals) -> None:
    ours = explain(death(signo, sent=("SIGTERM (forwarded)",)))
    assert ours is not None and ours.text == (f"rank 1 was ended by {signo.name}, which ddpboot sent it: SIGTERM "
                                              "(forwarded)")
    theirs = explain(death(signo))
    assert theirs is not None and theirs.tag == "another process" and "cannot tell who did" in theirs.text


def test_every_other_signal_gets_no_sentence() -> None:
    spoken = {signal.SIGKILL, signal.SIGXCPU, *CRASHES, *ENDINGS}
    for signo in signal.Signals:
        if signo not in spoken:
            assert explain(death(signo)) is None, signo
