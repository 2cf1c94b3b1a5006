"""Stragglers of an NCCL job by its collectives' durations (NCCL's flight recorder): which rank one dump points at,
the window's rule over dumps, only new collectives counted, the dumps asked for through real pipes, read, removed,
and kept once the collectives stopped moving."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ddpboot.launch.observe.pace import SAMPLES
from ddpboot.launch.observe.stacks.flight import Call
from ddpboot.launch.observe.straggler import Stragglers
from ddpboot.launch.observe.waits import PIPE, FlightWaits, Wait, WaitRule, ask, judge_calls
from tests.unit.launch.observe.jobs import Clock, gpu, job, slot, worker


def calls(*ms: float, first: int = 1, op: str = "all_reduce") -> dict[tuple[str, int], Call]:
    return {("0", first + i): Call(first + i, op, "completed", "", m) for i, m in enumerate(ms)}


@pytest.mark.parametrize(("durations", "rank"), [
    ({0: [27.0] * 4, 1: [2.4] * 4}, 1),  # rank 1 came last every time: the others waited 24.6 ms
    ({0: [2.4] * 4, 1: [27.0] * 4}, 0),
    ({0: [2.5] * 4, 1: [2.4] * 4}, None),  # even
    ({0: [4.0] * 4, 1: [2.4] * 4}, None),  # not twice as long
    ({0: [1.5] * 4, 1: [0.1] * 4}, None),  # fifteen times, but 1.4 ms: noise
    ({0: [27.0] * 2, 1: [2.4] * 2}, None),  # too few collectives to judge
    ({0: [27.0, 27.0, 27.0, 2.4, 2.4], 1: [2.4, 2.4, 2.4, 27.0, 27.0]}, None),  # 3 of 5 is no 80%
    ({0: [27.0] * 4 + [2.4], 1: [2.4] * 4 + [27.0]}, 1),  # 4 of 5 is
    ({0: [30.0] * 3, 1: [31.0] * 3, 2: [3.0] * 3, 3: [29.0] * 3}, 2),
    ({0: [30.0] * 3, 1: [3.0] * 3, 2: [3.0] * 3, 3: [29.0] * 3}, None),  # two late ranks: the other late one is fast
    ({0: [27.0] * 4}, None),  # one rank
])
def test_a_dump_points_at_the_rank_whose_collectives_the_others_waited_in(durations: dict[int, list[float]],
                                                                          rank: int | None) -> None:
    point, waits = judge_calls({r: calls(*ms) for r, ms in durations.items()})
    assert point == rank
    assert all(w.rank == rank for w in waits) and bool(waits) == (rank is not None)


def test_only_collectives_every_rank_completed_with_a_duration_count() -> None:
    got = {0: calls(27.0, 27.0, 27.0, 27.0), 1: calls(2.4, 2.4, 2.4)}  # rank 1 has not returned from #4 yet
    got[1][("0", 3)] = Call(3, "all_reduce", "completed", "", None)  # no timing: not judged
    assert judge_calls(got) == (None, [])  # two collectives judged: too few
    got[1][("0", 3)] = Call(3, "all_reduce", "completed", "", 2.4)
    point, waits = judge_calls(got)
    assert point == 1 and waits == [Wait(1, "all_reduce", 2.4, 27.0)] * 3


def group(*ms: float, first: int = 1, state: str = "completed") -> dict[str, tuple[Call, ...]]:
    return {"0": tuple(Call(first + i, "all_reduce", state, "", m) for i, m in enumerate(ms))}


def test_the_window_names_once_counts_new_collectives_only_and_clears() -> None:
    rule, said = WaitRule(), []
    for n in range(SAMPLES + 3):  # each dump holds everything since the start: only the new ones are judged
        got = rule.observe({0: group(*[27.0] * 4 * (n + 1)), 1: group(*[2.4] * 4 * (n + 1))})
        if got is not None:
            said.append(got)
    assert [s.rank for s in said] == [1]
    assert len(said[0].waits) == 4 * SAMPLES  # the window's collectives
    assert said[0].text(lambda r: "GPU 0, node 0") == (
        "ddpboot: straggler: rank 1 (GPU 0, node 0) is slower than the others: in 20 of its last collectives "
        "(all_reduce) the other ranks waited 24.6 ms on average for it (theirs lasted 27.0 ms, its own 2.4 ms; "
        "NCCL's flight recorder)")
    assert said[0].cell() == "others wait 24.6 ms"
    total = 4 * (SAMPLES + 3)
    for n in range(SAMPLES):  # even from now on
        got = rule.observe({0: {"0": group(*[27.0] * total)["0"] + group(*[2.5] * 4 * (n + 1), first=total + 1)["0"]},
                            1: {"0": group(*[2.4] * total)["0"] + group(*[2.4] * 4 * (n + 1), first=total + 1)["0"]}})
        if got is not None:
            said.append(got)
    assert [(s.rank, getattr(s, "before", None)) for s in said[1:]] == [(None, 1)]
    assert said[1].text(str) == ("ddpboot: straggler: rank 1 keeps pace again (no rank was persistently slower in "
                                 "the last 5 dumps of NCCL's flight recorder)")


def entry(rank_seq: int, ms: float) -> dict[str, Any]:
    return {"record_id": rank_seq - 1, "process_group": ("0", "default_pg"), "collective_seq_id": rank_seq,
            "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce", "state": "completed",
            "retired": True, "frames": [], "duration_ms": ms}


def dump(directory: Path, rank: int, ms: list[float]) -> Path:
    path = directory / f"nccl_trace_rank_{rank}"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [entry(i + 1, m) for i, m in enumerate(ms)]},
                                  protocol=2))
    return path


def test_a_dump_is_asked_for_through_each_ranks_pipe_without_waiting(tmp_path: Path) -> None:
    assert not ask(tmp_path, 0)  # no pipe yet (the rank has not made its process group)
    os.mkfifo(tmp_path / f"{PIPE}0.pipe")
    assert not ask(tmp_path, 0)  # nobody reads it: never blocks
    reader = os.open(tmp_path / f"{PIPE}0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # as torch's monitor holds it
    try:
        assert ask(tmp_path, 0)
        assert os.read(reader, 10) == b"1"
    finally:
        os.close(reader)


def test_the_dumps_are_read_removed_and_kept_once_nothing_moves(tmp_path: Path) -> None:
    readers = []
    for rank in (0, 1):
        os.mkfifo(tmp_path / f"{PIPE}{rank}.pipe")
        readers.append(os.open(tmp_path / f"{PIPE}{rank}.pipe", os.O_RDONLY | os.O_NONBLOCK))
    waits = FlightWaits(tmp_path)
    workers = [worker(0, 11, (gpu(0),), tmp_path), worker(1, 12, (gpu(1),), tmp_path)]
    try:
        assert waits.look(0.0, workers) is None  # the first look only asks
        assert [os.read(r, 10) for r in readers] == [b"1", b"1"]
        said = []
        for n in range(1, SAMPLES + 1):
            files = [dump(tmp_path, 0, [27.0] * 4 * n), dump(tmp_path, 1, [2.4] * 4 * n)]
            if (got := waits.look(2.0 * n, workers)) is not None:
                said.append(got)
            assert not any(f.exists() for f in files)  # read, and removed
            assert [os.read(r, 10) for r in readers] == [b"1", b"1"]  # the next asked for
        assert [s.rank for s in said] == [1]
        dump(tmp_path, 0, [27.0] * 4 * SAMPLES)  # one rank's dump only: the next look waits for the other's
        assert waits.look(12.0, workers) is None and (tmp_path / "nccl_trace_rank_0").exists()
        files = [dump(tmp_path, 0, [27.0] * 4 * SAMPLES), dump(tmp_path, 1, [2.4] * 4 * SAMPLES)]
        os.read(readers[0], 10), os.read(readers[1], 10)
        assert waits.look(14.0, workers) is None  # no collective moved since the last: a hang
        assert all(f.exists() for f in files)  # kept for what comes after
        assert waits.look(16.0, workers) is None
        assert [os.read(r, 10) if _ready(r) else b"" for r in readers] == [b"", b""]  # nothing more asked
    finally:
        for r in readers:
            os.close(r)


def _ready(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def test_an_nccl_job_with_a_log_dir_asked_to_is_judged_by_its_collectives_others_by_cpu(tmp_path: Path) -> None:
    clock = Clock(100.0)
    slots = (slot(0, (gpu(0),)), slot(1, (gpu(1),)))
    nccl = job(tmp_path, clock, [], slots, env={"DDPBOOT_STRAGGLER_NCCL": "1"}, straggler_window=5.0)
    nccl = replace(nccl, plan=replace(nccl.plan, backend="nccl"))
    watch = Stragglers.start(nccl)
    assert watch is not None and isinstance(getattr(watch.judge, "__self__", None), FlightWaits)
    assert watch.every == 2.0  # torch looks at its pipe once a second: a dump every 2 s at most
    root = nccl.paths.attempt(0).root
    root.mkdir(parents=True)
    left = dump(root, 0, [1.0])  # asked for, not read when the attempt ended
    watch.on_exit(replace(worker(0, 11, (gpu(0),), tmp_path), status=256))  # exit code 1
    watch.close()
    assert left.exists()  # a failed attempt keeps what torch wrote (a timeout's dump)
    watch = Stragglers.start(nccl)
    assert watch is not None
    watch.on_exit(replace(worker(0, 11, (gpu(0),), tmp_path), status=0))
    watch.close()
    assert not left.exists()
    assert watch.judge.__self__.directory == nccl.paths.attempt(0).root  # type: ignore[attr-defined]
    for other in (replace(nccl, temporary=True), replace(nccl, env={})):  # no --log-dir: no flight recorder; not asked
        cpu = Stragglers.start(other)
        assert cpu is not None and not isinstance(getattr(cpu.judge, "__self__", None), FlightWaits)
        assert cpu.every == 1.0
