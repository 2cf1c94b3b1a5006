"""Both backends against real Python processes: one that registered faulthandler as a ddpboot rank does, one that
did not (it must be left alive, not killed by the signal's default action)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.contract import RANK_STACKS_SIGNAL, STACKS_VAR, stacks_spec
from ddpboot.launch.observe.stacks.collect import BACKEND_VAR, RankTarget, catches, collect, find_py_spy

CHILD = f"""
import os, sys, time
from ddpboot.contract import register_stacks
if sys.argv[1] == "register":
    assert register_stacks(os.environ["{STACKS_VAR}"])
def waiting_here():
    print("ready", flush=True)
    time.sleep(120)
waiting_here()
"""


@pytest.fixture
def child(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], RankTarget]]:
    stacks = tmp_path / "rank0.stacks"
    env = {"PATH": "/usr/bin:/bin", STACKS_VAR: stacks_spec(RANK_STACKS_SIGNAL, str(stacks))}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, request.param], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc, RankTarget(0, proc.pid, "CPU", stacks)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("child", ["register"], indirect=True)
def test_faulthandler_backend_reads_a_registered_rank(child: tuple[subprocess.Popen[str], RankTarget]) -> None:
    proc, target = child
    assert catches(proc.pid, RANK_STACKS_SIGNAL)
    (stack,) = collect([target], {BACKEND_VAR: "faulthandler"})
    assert stack.backend == "faulthandler" and "in waiting_here" in stack.text, stack
    (again,) = collect([target], {BACKEND_VAR: "faulthandler"})  # the second dump is read on its own
    assert again.text.count("in waiting_here") == 1


@pytest.mark.parametrize("child", ["plain"], indirect=True)
def test_an_unregistered_rank_is_never_signalled(child: tuple[subprocess.Popen[str], RankTarget]) -> None:
    proc, target = child
    assert not catches(proc.pid, RANK_STACKS_SIGNAL)
    (stack,) = collect([target], {BACKEND_VAR: "faulthandler"})
    assert stack.backend is None and "registered no faulthandler" in (stack.problem or "")
    assert proc.poll() is None  # still running: the signal's default action would have killed it


@pytest.mark.parametrize("child", ["plain"], indirect=True)
def test_py_spy_backend_needs_no_registration(child: tuple[subprocess.Popen[str], RankTarget]) -> None:
    if find_py_spy({}) is None:
        pytest.skip("py-spy is not installed (pip install ddpboot[debug])")
    _, target = child
    (stack,) = collect([target], {})
    assert stack.backend == "py-spy" and "waiting_here" in stack.text, stack


def test_forcing_faulthandler_hides_py_spy_and_a_missing_rank_is_said() -> None:
    assert find_py_spy({BACKEND_VAR: "faulthandler"}) is None
    (stack,) = collect([RankTarget(3, 2**22 + 7, "CPU", None)], {BACKEND_VAR: "py-spy"})  # no such process
    assert stack.backend is None and stack.problem and "py-spy" in stack.problem
