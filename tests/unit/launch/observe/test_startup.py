"""The start-up observer on the fake clock of jobs.py, reading phases files as the ranks append them."""

from __future__ import annotations

from pathlib import Path

from ddpboot.contract import phases_file
from ddpboot.launch.observe.startup import POLL_INTERVAL, Startup, read_marks
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.supervisor.workers import Worker
from tests.unit.launch.observe.jobs import Attempt, Clock, job, worker

WALL0 = 1000.0  # jobs.py's status: wall = 1000 + clock


def marks(w: Worker, **at: float) -> None:
    path = phases_file(str(w.error_file))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for name, t in at.items():
            f.write(f"{name} {WALL0 + t}\n")


def test_the_line_comes_once_every_group_is_up_and_names_the_slow_rank(tmp_path: Path) -> None:
    clock, said = Clock(100.0), []
    j = job(tmp_path, clock, said)
    obs = Startup(j.status, j.say, clock, wall=lambda: WALL0 + clock.now)
    ws = [worker(0, 10, run=tmp_path), worker(1, 11, run=tmp_path)]  # started at 99.0
    marks(ws[0], up=99.5, torch=102.0, pg_start=102.1)
    marks(ws[1], up=99.5)
    assert obs.due(100.0) == -float("inf")
    obs.on_wake(100.0, Attempt(ws))
    assert obs.due(100.0) == 100.0 + POLL_INTERVAL and said == []
    assert isinstance(j.status, RunStatus) and j.status.current == {0: "rendezvous", 1: "imports"}
    clock.now = 109.0
    marks(ws[1], torch=108.0, pg_start=108.1, pg=108.5)
    marks(ws[0], pg=108.5)
    obs.on_output(1, b"step 1\n")  # before its group was seen up: not its first output after it
    obs.on_wake(109.0, Attempt(ws))
    assert said == ["ddpboot: start-up 9.5 s: slowest rank 1: imports 8.5 s (the others at most 2.5 s)"]
    assert obs.due(109.0) is None  # done: no more reading
    assert j.status.current == {}  # every group is up: no phase column
    obs.on_wake(120.0, Attempt(ws))  # the loop still wakes it: nothing to do
    assert isinstance(j.status, RunStatus)
    assert j.status.startup[0] == {"python": 0.5, "imports": 2.5, "setup": 0.1, "rendezvous": 6.4}
    clock.now = 110.0
    obs.on_output(1, b"step 2\n")
    obs.close()
    assert j.status.startup[1]["first_output"] == 1.5 and said == said[:1]


def test_ranks_alike_get_no_line_and_a_failure_before_the_group_publishes_what_there_was(tmp_path: Path) -> None:
    clock, said = Clock(100.0), []
    j = job(tmp_path, clock, said)
    obs = Startup(j.status, j.say, clock, wall=lambda: WALL0 + clock.now)
    ws = [worker(0, 10, run=tmp_path), worker(1, 11, run=tmp_path)]
    marks(ws[0], up=99.5, torch=102.0)
    marks(ws[1], up=99.6, torch=102.3)
    obs.on_wake(103.0, Attempt(ws))
    obs.close()  # rank 1 failed before init_process_group
    assert said == [] and isinstance(j.status, RunStatus)
    assert j.status.startup == {0: {"python": 0.5, "imports": 2.5}, 1: {"python": 0.6, "imports": 2.7}}


def test_a_program_that_is_not_python_is_not_watched_and_a_line_being_written_waits(tmp_path: Path) -> None:
    from ddpboot.launch.pymain import TargetKind
    from ddpboot.launch.spec import Target

    clock = Clock()
    assert Startup.start(job(tmp_path, clock, [], target=Target(TargetKind.BINARY, "sh", ()))) is None
    assert Startup.start(job(tmp_path, clock, [])) is not None
    (tmp_path / "m").write_text("up 1.5\ntorch 2.0\npg_st")
    assert read_marks(tmp_path / "m") == {"up": 1.5, "torch": 2.0}
    assert read_marks(tmp_path / "none") == {}


def test_nccl_s_own_init_time_is_read_from_its_init_log(tmp_path: Path) -> None:
    from ddpboot.launch.observe.startup import read_nccl_init

    log = tmp_path / "rank0.error.json.nccl"
    assert read_nccl_init(log) is None
    log.write_text(  # NCCL 2.28.9's lines, as a 1-rank job writes them
        "vm:582:582 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "vm:582:582 [0] NCCL INFO ncclCommInitRankConfig comm 0x1aa38e10 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 60 "
        "commId 0xe97170aed5ca75ac - Init COMPLETE\n")
    assert read_nccl_init(log) is None
    with log.open("a") as f:
        f.write("vm:582:582 [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 0 nranks 1 total 0.54 (kernels "
                "0.50, alloc 0.00, bootstrap 0.02, allgathers 0.00, topo 0.00, graphs 0.00, connections 0.01, rest "
                "0.00)\nvm:582:582 [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 0 nranks 1 total 9.00\n")
    assert read_nccl_init(log) == 0.54  # the first communicator's


def test_nccl_s_init_comes_after_the_line_and_is_published(tmp_path: Path) -> None:
    from ddpboot.contract import nccl_init_file
    from ddpboot.launch.observe.startup import NCCL_WAIT
    from tests.unit.launch.observe.jobs import gpu

    clock, said = Clock(100.0), []
    j = job(tmp_path, clock, said)
    obs = Startup(j.status, j.say, clock, wall=lambda: WALL0 + clock.now)
    w = worker(0, 10, (gpu(0),), run=tmp_path)
    marks(w, up=99.5, torch=101.0, cuda_start=101.1, cuda=101.6, pg_start=101.7, pg=101.8)
    obs.on_wake(102.0, Attempt([w]))
    assert obs.due(102.0) == 102.0 + POLL_INTERVAL  # looking for NCCL's init
    nccl_init_file(str(w.error_file)).write_text("h:1:1 [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 0 "
                                                 "nranks 1 total 0.75 (kernels 0.5)\n")
    obs.on_wake(102.0 + POLL_INTERVAL, Attempt([w]))
    assert isinstance(j.status, RunStatus) and j.status.startup[0]["nccl"] == 0.75
    assert list(j.status.startup[0])[:4] == ["python", "imports", "cuda", "nccl"]
    assert obs.due(110.0) is None  # found: done
    other = Startup(j.status, j.say, clock, wall=lambda: WALL0 + clock.now)
    silent = worker(0, 10, (gpu(0),), run=tmp_path / "b")  # a rank whose NCCL never initialises
    marks(silent, up=99.5, torch=101.0, pg_start=101.7, pg=101.8)
    other.on_wake(102.0, Attempt([silent]))
    assert other.due(102.0) == 102.0 + POLL_INTERVAL
    other.on_wake(102.0 + NCCL_WAIT, Attempt([silent]))
    assert other.due(200.0) is None  # given up after NCCL_WAIT
