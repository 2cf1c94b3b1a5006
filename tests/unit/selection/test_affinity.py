"""Cores per rank: near its GPU, split fairly, within what the launcher may use; torchrun's NUMA policies on
simulated topologies."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import UsageError
from ddpboot.selection.affinity import (
    CoreLists,
    NumaPolicy,
    Topology,
    assign_cores,
    explicit_cores,
    format_cpu_list,
    memory_nodes,
    numa_cores,
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


# --- torchrun's NUMA policies (--numa-binding), for each rank's own GPU --------------------------------------------

def node_cpus(n: int) -> tuple[int, ...]:
    """NUMA node n of the simulated machine: physical cores 8n..8n+7, their hyperthreads 32 above."""
    return (*range(8 * n, 8 * n + 8), *range(32 + 8 * n, 32 + 8 * n + 8))


def simulated_topology() -> Topology:
    """2 sockets of 2 NUMA nodes, 8 cores of 2 threads per node, one L3 per 4 cores (2 per node): 64 CPUs."""
    node = {c: n for n in range(4) for c in node_cpus(n)}
    return Topology(
        node=node,
        socket={c: n // 2 for c, n in node.items()},
        core={c: c % 32 for c in node},
        cache={c: (c % 32) // 4 * 4 for c in node},
    )


def numa_machine() -> Inventory:
    """8 GPUs, two on each NUMA node of the simulated topology (GPU g on node g // 2)."""
    return Inventory(tuple(GPU(g, f"GPU-{g:04d}bbbb", f"00000000:{g + 1:02X}:00.0", "X", 2**30, 0, 0,
                               cpu_affinity=node_cpus(g // 2), numa_node=g // 2) for g in range(8)), "fake")


def bound(policy: str, near: list[tuple[int, ...]], allowed: range | list[int] = range(64)) -> list[tuple[int, ...]]:
    return numa_cores(NumaPolicy(policy), near, allowed, simulated_topology())


def test_node_and_socket_bind_every_allowed_cpu_of_the_gpus_node_or_socket() -> None:
    near = [node_cpus(3), node_cpus(0)]
    assert bound("node", near) == [tuple(sorted(node_cpus(3))), tuple(sorted(node_cpus(0)))]
    assert bound("socket", near) == [tuple(sorted(node_cpus(2) + node_cpus(3))),
                                     tuple(sorted(node_cpus(0) + node_cpus(1)))]
    assert bound("node", [node_cpus(1)], allowed=[9, 10, 41, 60]) == [(9, 10, 41)]  # within what may be used


def test_exclusive_divides_the_nodes_physical_cores_among_its_ranks() -> None:
    two = bound("exclusive", [node_cpus(0), node_cpus(0), node_cpus(2)])
    assert two[0] == (0, 1, 2, 3, 32, 33, 34, 35) and two[1] == (4, 5, 6, 7, 36, 37, 38, 39)  # hyperthreads kept
    assert two[2] == tuple(sorted(node_cpus(2)))  # alone on its node: all of it
    three = bound("exclusive", [node_cpus(1)] * 3)
    assert [len(c) // 2 for c in three] == [3, 3, 2]  # 8 cores for 3 ranks: the first ranks get the extra one
    assert not set(three[0]) & set(three[1]) and not set(three[1]) & set(three[2])
    with pytest.raises(UsageError, match="9 ranks' GPUs are on one NUMA node with only 8 physical cores"):
        bound("exclusive", [node_cpus(0)] * 9)


def test_core_complex_gives_each_rank_its_own_last_level_cache_while_there_are_enough() -> None:
    got = bound("core-complex", [node_cpus(1)] * 3)
    assert got[0] == (8, 9, 10, 11, 40, 41, 42, 43) and got[1] == (12, 13, 14, 15, 44, 45, 46, 47)
    assert got[2] == got[0]  # two caches for three ranks: they share again
    # A cache partly outside the allowed cores comes after the full one.
    assert bound("core-complex", [node_cpus(0)], allowed=[0, 4, 5, 6]) == [(4, 5, 6)]


def test_a_rank_without_a_known_numa_node_is_an_error() -> None:
    with pytest.raises(UsageError, match="rank 1 has no GPU whose NUMA node ddpboot knows"):
        bound("node", [node_cpus(0), ()])
    with pytest.raises(UsageError, match="rank 0's NUMA node has no core this launcher may use"):
        bound("socket", [node_cpus(0)], allowed=[60, 61])


def test_the_policy_follows_the_ranks_physical_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun binds local rank 0 by GPU 0's node; ddpboot's rank 0 on GPU 6 is bound by GPU 6's node (3)."""
    monkeypatch.setattr(Topology, "read", classmethod(lambda cls, root=None: simulated_topology()))
    for policy, want in (("node", node_cpus(3)), ("socket", node_cpus(2) + node_cpus(3))):
        p = make_plan(parse_request(gpus="6,0", cpu_affinity=policy), numa_machine(), {}, allowed_cpus=range(64))
        assert p.ranks[0].cpus == tuple(sorted(want)) and p.ranks[1].cpus == tuple(sorted(node_cpus(0) + (
            node_cpus(1) if policy == "socket" else ())))
    p = make_plan(parse_request(gpus="7,6", cpu_affinity="exclusive"), numa_machine(), {}, allowed_cpus=range(64))
    assert [r.cpus for r in p.ranks] == [(24, 25, 26, 27, 56, 57, 58, 59), (28, 29, 30, 31, 60, 61, 62, 63)]
    assert [r.omp_threads for r in p.ranks] == [8, 8]
    assert parse_cpu_affinity(" Core-Complex ") == NumaPolicy("core-complex")


def test_a_numa_policy_prefers_each_ranks_memory_from_its_cores_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Topology, "read", classmethod(lambda cls, root=None: simulated_topology()))
    for policy, want in (("node", [(3,), (0,)]), ("socket", [(2, 3), (0, 1)])):
        p = make_plan(parse_request(gpus="6,0", cpu_affinity=policy), numa_machine(), {}, allowed_cpus=range(64))
        assert [r.mem_nodes for r in p.ranks] == want
        assert p.ranks[0].to_json()["mem_nodes"] == list(want[0])
    auto = make_plan(parse_request(gpus="6,0"), numa_machine(), {}, allowed_cpus=range(64))
    assert [r.mem_nodes for r in auto.ranks] == [(), ()]  # only the NUMA policies set a memory policy
    assert memory_nodes("none", [(1, 2)]) == [()]


def test_the_topology_is_read_from_sysfs(tmp_path: Path) -> None:
    """A tree laid out as /sys/devices/system: 2 nodes, 4 CPUs, 2 threads per core, one L3 per node."""
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text + "\n")

    write("node/node0/cpulist", "0,2")
    write("node/node1/cpulist", "1,3")
    write("node/online", "0-1")  # not a node directory
    for cpu in range(4):
        base = f"cpu/cpu{cpu}"
        write(f"{base}/topology/physical_package_id", str(cpu % 2))
        write(f"{base}/topology/thread_siblings_list", f"{cpu % 2},{cpu % 2 + 2}")
        for index, (kind, level, shared) in enumerate([("Instruction", 1, str(cpu)), ("Data", 1, str(cpu)),
                                                       ("Unified", 3, f"{cpu % 2},{cpu % 2 + 2}")]):
            write(f"{base}/cache/index{index}/type", kind)
            write(f"{base}/cache/index{index}/level", str(level))
            write(f"{base}/cache/index{index}/shared_cpu_list", shared)
    topo = Topology.read(tmp_path)
    assert topo.node == {0: 0, 2: 0, 1: 1, 3: 1} and topo.socket == {0: 0, 1: 1, 2: 0, 3: 1}
    assert topo.core == {0: 0, 1: 1, 2: 0, 3: 1} and topo.cache == {0: 0, 1: 1, 2: 0, 3: 1}
    bare = Topology.read(tmp_path / "nothing")  # no sysfs: one node, one socket, a core per CPU
    assert numa_cores(NumaPolicy("socket"), [(0, 1)], [0, 1, 2], bare) == [(0, 1, 2)]
    assert numa_cores(NumaPolicy("exclusive"), [(0, 1), (0, 1)], [0, 1, 2], bare) == [(0, 1), (2,)]
