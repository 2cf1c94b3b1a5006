"""One attempt's workers as data: command, environment, output routing; wait statuses as exit codes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ddpboot.contract import Isolation
from ddpboot.launch.logs import Console
from ddpboot.launch.rundir import AttemptPaths
from ddpboot.launch.spec import Routing, Std, Target
from ddpboot.launch.supervisor.workers import AttemptSetup, describe_status, exit_code_of, make_workers
from ddpboot.selection.planner import Plan, RankSlot
from tests.support import launch_spec

EXITED_3 = 3 << 8  # the wait status of exit(3)
KILLED_BY_SIGKILL = signal.SIGKILL


def plan(n: int = 2) -> Plan:
    slots = tuple(RankSlot(rank=10 + i, local_rank=i, gpus=(), cuda_visible_devices="", device="cpu")
                  for i in range(n))
    return Plan(ranks=slots, world_size=20, nnodes=2, node_rank=1, isolation=Isolation.NODE, backend="gloo")


def setup(routing: Routing, with_files: bool = True) -> AttemptSetup:
    spec = launch_spec(target=Target("script", "train.py", ("--rank", "${local_rank}")), python="/usr/bin/python3",
                       run_id="job", max_restarts=2, routing=routing, signals=(signal.SIGUSR1,))
    return AttemptSetup(spec, plan(), {"PATH": "/bin", "OMP_NUM_THREADS": "4"}, 29500,
                        Console(os.open(os.devnull, os.O_WRONLY)), with_files)


def test_wait_statuses_read_as_shell_exit_codes() -> None:
    assert exit_code_of(EXITED_3) == 3 and describe_status(EXITED_3) == "exit code 3"
    assert exit_code_of(KILLED_BY_SIGKILL) == 137
    assert describe_status(KILLED_BY_SIGKILL) == "killed by SIGKILL (exit code 137)"


def test_each_worker_gets_its_command_and_the_attempts_environment(tmp_path: Path) -> None:
    workers = make_workers(setup(Routing()), 1, AttemptPaths(tmp_path))
    assert [w.argv for w in workers] == [["/usr/bin/python3", "-u", "train.py", "--rank", "0"],
                                         ["/usr/bin/python3", "-u", "train.py", "--rank", "1"]]
    env = workers[1].env
    assert env["PATH"] == "/bin" and env["RANK"] == "11" and env["MASTER_PORT"] == "29500"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_MAX_RESTARTS"] == "2"
    assert env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGUSR1"
    assert env["TORCHELASTIC_ERROR_FILE"] == str(tmp_path / "rank11.error.json")
    assert all(w.log is None for w in workers)  # nothing routed to files


def test_log_files_only_for_the_ranks_routed_to_them(tmp_path: Path) -> None:
    workers = make_workers(setup(Routing(files={1: Std.ERR})), 0, AttemptPaths(tmp_path))
    assert workers[0].log is None
    assert workers[1].log is not None and workers[1].log.path == tmp_path / "rank11.log"
    assert workers[1].err.file is workers[1].log and workers[1].out.file is None
    for w in workers:
        w.close_output()
    assert not make_workers(setup(Routing(files={1: Std.ERR}), with_files=False), 0,
                          AttemptPaths(tmp_path))[1].log
