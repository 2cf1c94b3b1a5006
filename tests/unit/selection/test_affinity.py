"""Cores per rank: near its GPU, split fairly, within what the launcher may use."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import UsageError
from ddpboot.selection.affinity import (
    CoreLists,
    assign_cores,
    explicit_cores,
    format_cpu_list,
    parse_cpu_affinity,
    parse_cpu_list,
    rank_cores,
    split_fairly,
)
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.planner import make_plan
from ddpboot.selection.request import parse_request


def two_socket_machine() -> Inventory:
    """8 GPUs: 0-3 near cores 0-15 (NUMA 0), 4-7 near cores 16-31 (NUMA 1)."""
    gpus = tuple(
        GPU(
            i,
            f"GPU-{i:04d}aaaa",
            f"00000000:{i + 1:02X}:00.0",
            "X",
            2**30,
            0,
            0,
            cpu_affinity=tuple(range(0, 16)) if i < 4 else tuple(range(16, 32)),
            numa_node=i // 4,
        )
        for i in range(8)
    )
    return Inventory(gpus, "fake")


def test_parse_and_format() -> None:
    assert parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list((11, 0, 1, 2, 3, 8, 10)) == "0-3,8,10-11"
    for bad in ("", "a", "3-1", "1,,2", "-1", "1-2-3"):
        with pytest.raises(UsageError):
            parse_cpu_list(bad)
    with pytest.raises(UsageError, match="more than once"):
        parse_cpu_list("1,1")


def test_split_fairly() -> None:
    assert split_fairly(range(10), 3) == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]
    assert split_fairly([5, 6], 3) == [(5,), (6,), (5,)]


@given(st.sets(st.integers(0, 127), min_size=1, max_size=64), st.integers(1, 16))
def test_split_covers_every_core_once_when_enough(cores: set[int], n: int) -> None:
    chunks = split_fairly(sorted(cores), n)
    assert len(chunks) == n and all(chunks)
    if len(cores) >= n:
        flat = [c for ch in chunks for c in ch]
        assert sorted(flat) == sorted(cores)
        assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_ranks_get_cores_near_their_gpu_not_gpu0s() -> None:
    # The accelerate bug: rank 0 on GPU 6 must get NUMA 1's cores, not GPU 0's.
    p = make_plan(parse_request(gpus="6,1"), two_socket_machine(), {}, allowed_cpus=range(32))
    assert p.ranks[0].cpus == tuple(range(16, 32))
    assert p.ranks[1].cpus == tuple(range(0, 16))
    assert [r.omp_threads for r in p.ranks] == [16, 16]


def test_ranks_on_one_numa_node_split_it() -> None:
    p = make_plan(parse_request(nproc="4", exclude="0-1"), two_socket_machine(), {}, allowed_cpus=range(32))
    assert [r.gpus[0].index for r in p.ranks] == [2, 3, 4, 5]
    assert [r.cpus for r in p.ranks] == [
        tuple(range(0, 8)),
        tuple(range(8, 16)),
        tuple(range(16, 24)),
        tuple(range(24, 32)),
    ]


def test_only_cores_the_launcher_may_use() -> None:
    p = make_plan(parse_request(gpus="0,1"), two_socket_machine(), {}, allowed_cpus=[2, 3, 4, 20])
    assert p.ranks[0].cpus == (2, 3) and p.ranks[1].cpus == (4,)


def test_near_cores_all_forbidden_falls_back_to_allowed() -> None:
    p = make_plan(parse_request(gpus="0"), two_socket_machine(), {}, allowed_cpus=[20, 21])
    assert p.ranks[0].cpus == (20, 21)


def test_cpu_ranks_share_the_allowed_cores() -> None:
    p = make_plan(parse_request(nproc="2"), Inventory((), "none"), {}, allowed_cpus=[0, 1, 2])
    assert [r.cpus for r in p.ranks] == [(0, 1), (2,)] and [r.omp_threads for r in p.ranks] == [2, 1]


def test_more_ranks_than_cores_get_one_thread() -> None:
    p = make_plan(parse_request(nproc="3"), Inventory((), "none"), {}, allowed_cpus=[0, 1])
    assert [r.omp_threads for r in p.ranks] == [1, 1, 1]


def test_none_binds_nothing_but_still_shares_threads() -> None:
    p = make_plan(parse_request(nproc="2", cpu_affinity="none"), Inventory((), "none"), {}, allowed_cpus=range(8))
    assert [r.cpus for r in p.ranks] == [(), ()] and [r.omp_threads for r in p.ranks] == [4, 4]


def lists(text: str) -> CoreLists:
    spec = parse_cpu_affinity(text)
    assert isinstance(spec, CoreLists)
    return spec


def test_parse_cpu_affinity() -> None:
    assert parse_cpu_affinity(" AUTO ") == "auto" and parse_cpu_affinity("None") == "none"
    assert parse_cpu_affinity("0-1,4") == CoreLists("0-1,4", ((0, 1, 4),), per_rank=False)
    assert parse_cpu_affinity("0;2-3") == CoreLists("0;2-3", ((0,), (2, 3)), per_rank=True)
    for bad in ("", "auto,1", "0;x", "0-3;"):
        with pytest.raises(UsageError, match="--cpu-affinity"):
            parse_cpu_affinity(bad)


def test_explicit_lists() -> None:
    assert explicit_cores(lists("0-3"), 2, range(8)) == [(0, 1), (2, 3)]
    assert explicit_cores(lists("4-7;0-1"), 2, range(8)) == [(4, 5, 6, 7), (0, 1)]
    with pytest.raises(UsageError, match="names cores 8-9, which this launcher may not use"):
        explicit_cores(lists("0-9"), 2, range(8))
    with pytest.raises(UsageError, match="gives 3 core lists for 2 ranks; give one per rank"):
        explicit_cores(lists("0;1;2"), 2, range(8))


def test_rank_cores_and_threads() -> None:
    assert rank_cores("none", [(), (), ()], range(7)) == ([(), (), ()], [2, 2, 2])
    assert rank_cores("auto", [(0, 1), (2, 3)], range(4)) == ([(0, 1), (2, 3)], [2, 2])
    assert rank_cores(lists("0-2"), [(), ()], range(4)) == ([(0, 1), (2,)], [2, 1])
    assert rank_cores(lists("0;0"), [(), ()], range(4)) == ([(0,), (0,)], [1, 1])  # a shared core: one thread each


def test_explicit_affinity_through_the_planner() -> None:
    p = make_plan(parse_request(nproc="2", cpu_affinity="4-7;0-1"), Inventory((), "none"), {}, allowed_cpus=range(8))
    assert [r.cpus for r in p.ranks] == [(4, 5, 6, 7), (0, 1)] and [r.omp_threads for r in p.ranks] == [4, 2]


def test_assign_cores_unknown_nearness() -> None:
    assert assign_cores([(), ()], [0, 1, 2, 3]) == [(0, 1), (2, 3)]


def test_a_backwards_range_is_named_as_such() -> None:
    with pytest.raises(UsageError, match=r"'1-0' runs backwards. Write it low to high: 0-1"):
        parse_cpu_list("1-0", "--cpu-affinity")
