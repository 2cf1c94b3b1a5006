"""The D-state observer on the fake clock of jobs.py, the ranks' states as /proc would give them."""

from __future__ import annotations

import os
from pathlib import Path

from ddpboot.launch.observe.dstate import CHECK_INTERVAL, TIMEOUT_VAR, Uninterruptible, parse_timeout, read_state
from ddpboot.launch.observe.stacks.dump import VERDICT_PREFIX
from tests.unit.launch.observe.jobs import Attempt, Clock, job, worker


def test_a_rank_in_d_state_past_the_timeout_is_said_once_per_stay() -> None:
    states: dict[int, tuple[str, str] | None] = {10: ("S", ""), 11: ("D", "nfs_wait_bit_killable")}
    warned: list[str] = []
    said: list[str] = []
    obs = Uninterruptible(30.0, warned.append, said.append, read=lambda pid: states[pid])
    ws = [worker(0, 10), worker(1, 11)]
    assert obs.due(100.0) == -float("inf")
    obs.on_wake(100.0, Attempt(ws))
    assert obs.due(100.0) == 100.0 + CHECK_INTERVAL
    obs.on_wake(100.5, Attempt(ws))  # not due: not looked at
    obs.on_wake(129.0, Attempt(ws))
    assert warned == []
    obs.on_wake(130.0, Attempt(ws))
    assert warned == ["ddpboot: warning: rank 1 (pid 11) is stuck in the kernel: in uninterruptible sleep (D state) "
                      f"for 30 s, in nfs_wait_bit_killable ({TIMEOUT_VAR}=30); no signal ends it until the call "
                      "returns"]
    obs.on_wake(200.0, Attempt(ws))
    assert len(warned) == 1  # once per stay
    states[11] = ("R", "")
    obs.on_wake(201.0, Attempt(ws))
    states[11] = ("D", "__refrigerator")
    obs.on_wake(202.0, Attempt(ws))
    obs.on_wake(232.0, Attempt(ws))
    assert len(warned) == 2 and "in __refrigerator" in warned[1]  # a new stay
    obs.on_dump("SIGUSR2", 240.0, Attempt(ws))
    assert said == [VERDICT_PREFIX + "rank 1 (pid 11) is stuck in the kernel: in uninterruptible sleep (D state) for "
                    "38 s, in __refrigerator"]


def test_without_the_variable_nothing_is_said_but_the_dump_names_a_stuck_rank(tmp_path: Path) -> None:
    clock = Clock()
    obs = Uninterruptible.start(job(tmp_path, clock, []))
    assert obs.timeout is None and obs.due(100.0) is None
    warned: list[str] = []
    said: list[str] = []
    quiet = Uninterruptible(None, warned.append, said.append, read=lambda pid: ("D", "?"))
    quiet.on_wake(100.0, Attempt([worker(0, 10)]))
    quiet.on_wake(1000.0, Attempt([worker(0, 10)]))
    assert warned == []
    quiet.on_dump("stall", 1000.0, Attempt([worker(0, 10)]))
    assert said == [VERDICT_PREFIX + "rank 0 (pid 10) is stuck in the kernel: in uninterruptible sleep (D state) for "
                    "900 s, in ?"]
    exited = worker(0, 10)
    exited.status = 0
    none: list[str] = []
    Uninterruptible(None, none.append, none.append, read=lambda pid: ("D", "?")).on_dump("x", 1.0, Attempt([exited]))
    assert none == []


def test_the_variable_and_a_real_process_state() -> None:
    assert parse_timeout({TIMEOUT_VAR: "30"}) == 30.0
    assert parse_timeout({}) is None and parse_timeout({TIMEOUT_VAR: "x"}) is None
    assert parse_timeout({TIMEOUT_VAR: "0"}) is None
    state = read_state(os.getpid())
    assert state is not None and state[0] in "RS" and state[1] == ""
    assert read_state(0) is None
