"""parse_request: the selection options as typed become a typed Request; bad syntax and contradictions are refused
before anything looks at the machine."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.contract import Isolation
from ddpboot.errors import UsageError
from ddpboot.selection.affinity import CoreLists
from ddpboot.selection.gpu_list import BusId, GpuIndex, MigInstance, UuidPrefix
from ddpboot.selection.request import (
    DEFAULT_MAX_USED_MEMORY,
    DEFAULT_MAX_UTIL,
    Request,
    parse_isolation,
    parse_nproc,
    parse_request,
)


def test_defaults() -> None:
    req = parse_request()
    assert req == Request()
    assert (req.nproc, req.gpus, req.exclude, req.isolation, req.cpu_affinity) == (None, None, None, "rank", "auto")
    assert (req.max_used_memory, req.max_util) == (DEFAULT_MAX_USED_MEMORY, DEFAULT_MAX_UTIL) == (256 * 2**20, 5)


def test_every_option_is_typed() -> None:
    req = parse_request(
        nproc="4",
        gpus="0-1,3:1,0000:18:00.0,GPU-ab",
        exclude="7",
        gpus_per_proc=1,
        isolation="Node",
        cpu=False,
        max_used_memory=1024,
        max_util=50,
        nnodes=2,
        node_rank=1,
        cpu_affinity="0-3;4-7",
        share=True,
    )
    assert req.nproc == 4 and req.isolation == "node"
    assert req.gpus is not None and req.gpus.text == "0-1,3:1,0000:18:00.0,GPU-ab"
    assert req.gpus.tokens == (
        GpuIndex("0", 0),
        GpuIndex("1", 1),
        MigInstance("3:1", 3, 1),
        BusId("0000:18:00.0", (0, 0x18, 0, 0)),
        UuidPrefix("GPU-ab"),
    )
    assert req.exclude is not None and req.exclude.tokens == (GpuIndex("7", 7),)
    assert req.cpu_affinity == CoreLists("0-3;4-7", ((0, 1, 2, 3), (4, 5, 6, 7)), per_rank=True)
    assert (req.max_used_memory, req.max_util, req.nnodes, req.node_rank, req.share) == (1024, 50, 2, 1, True)


def test_empty_lists_count_as_not_given() -> None:
    assert parse_request(gpus="", exclude="") == Request()


@pytest.mark.parametrize(
    ("text", "value"),
    [(None, None), ("1", 1), ("16", 16), (" 3 ", 3), ("+2", 2), ("gpu", "gpu"), ("AUTO", "auto"), (" cpu", "cpu")],
)
def test_nproc(text: str | None, value: int | str | None) -> None:
    assert parse_nproc(text) == value


@given(st.integers(-1000, 1000))
def test_nproc_counts(n: int) -> None:
    if n >= 1:
        assert parse_nproc(str(n)) == n
    else:
        with pytest.raises(UsageError, match=f"--nproc {n}: the number of processes must be at least 1"):
            parse_nproc(str(n))


@given(st.text(max_size=8))
def test_nproc_refuses_everything_else(text: str) -> None:
    t = text.strip().lower()
    if t in ("gpu", "auto", "cpu") or t.lstrip("+-").isdigit():
        return  # valid (counts are covered above), or a digit-like character left to the line above
    with pytest.raises(UsageError):
        parse_nproc(text)


@pytest.mark.parametrize("text", ["rank", "node", " NODE ", "Rank"])
def test_isolation(text: str) -> None:
    mode = parse_isolation(text)
    assert isinstance(mode, Isolation) and mode.value == text.strip().lower()


def test_isolation_modes_carry_their_meaning() -> None:
    own, node = ["GPU-a", "GPU-b"], ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    assert Isolation.RANK.visible_devices(own, node) == "GPU-a,GPU-b"
    assert Isolation.NODE.visible_devices(own, node) == "GPU-a,GPU-b,GPU-c,GPU-d"
    assert [Isolation.RANK.first_device(r, 2) for r in range(2)] == [0, 0]
    assert [Isolation.NODE.first_device(r, 2) for r in range(2)] == [0, 2]
    assert (Isolation.RANK.exported_local_rank(3), Isolation.NODE.exported_local_rank(3)) == (0, 3)
    assert str(Isolation.NODE) == "node" and Isolation.RANK == "rank"  # a str: JSON and f-strings show the name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"isolation": "numa"}, "--isolation 'numa': choose rank (each worker sees only its own GPUs) or node "
         "(every worker sees all the node's GPUs, as under torchrun)."),
        ({"gpus_per_proc": 0}, "--gpus-per-proc 0: each process needs at least 1 GPU."),
        ({"nnodes": 0}, "--nnodes 0: at least 1 node."),
        ({"nnodes": 2, "node_rank": 2}, "--node-rank 2 is outside 0..1 (--nnodes 2)."),
        ({"node_rank": -1}, "--node-rank -1 is outside 0..0 (--nnodes 1)."),
        ({"nproc": "0"}, "--nproc 0: the number of processes must be at least 1."),
        ({"nproc": "four"}, "--nproc 'four' is not a process count. Give a number, or gpu, auto or cpu."),
        ({"exclude": "x"}, "--exclude 'x': entry 1: 'x' is not a GPU."),
        ({"gpus": " "}, "--gpus is empty."),
        ({"gpus": "1,"}, "--gpus '1,': entry 2 is empty (two commas in a row, or a trailing comma)."),
        ({"gpus": "3-1"}, "--gpus '3-1': entry 1: the range '3-1' runs backwards; write 1-3."),
        ({"cpu": True, "gpus": "1"}, "--cpu and --gpus contradict each other: choose CPU ranks or GPUs."),
        ({"cpu": True, "nproc": "gpu"}, "--cpu with --nproc gpu: give a number of CPU ranks (or --nproc cpu)."),
        ({"nproc": "cpu", "gpus": "1"}, "--nproc cpu and --gpus contradict each other: choose CPU ranks or GPUs."),
        ({"nproc": "auto", "gpus": "1"}, "--nproc auto chooses GPUs itself; with --gpus, leave --nproc out."),
        ({"cpu_affinity": "0-x"}, "--cpu-affinity '0-x': '0-x' is not a core number or range."),
        ({"cpu_affinity": "0-3;"}, "--cpu-affinity '': '' is not a core number or range."),
        ({"cpu_affinity": "1,1"}, "--cpu-affinity '1,1' names a core more than once."),
    ],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_request(**options)
    assert str(err.value).startswith(message), str(err.value)
