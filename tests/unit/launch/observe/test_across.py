"""The straggler watch across nodes: each node's shares into node 0's store (one short connection a sample), node 0
comparing the fresh ones with its own, a node whose samples stopped left out, a store that cannot be reached leaving
node 0 to its own ranks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ddpboot.launch.observe.across import STALE, Across, Fresh, decode, encode, key
from ddpboot.launch.observe.straggler import Stragglers
from tests.support import free_port
from tests.unit.launch.observe.jobs import Clock, job, slot


class Store:
    """Node 0's store as Across uses it, one dict behind every connection."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.connections = 0

    def __call__(self, host: str, port: int, timeout: float) -> Store:
        self.connections += 1
        return self

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, k: str, v: str) -> None:
        self.data[k] = v.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.data[k] for k in keys]


def test_a_record_is_read_back_and_anything_else_is_none() -> None:
    assert decode(encode(1, 7, {3: 0.91234567}).encode()) == (1, 7, {3: 0.9123})
    assert [decode(b) for b in (b"", b"[]", b'{"node": 1}', b'{"node": "x", "count": 1, "shares": {}}')] == [None] * 4


def test_a_node_whose_samples_stopped_is_left_out_until_they_move_again() -> None:
    fresh = Fresh()
    assert [fresh.keep(1, 5) for _ in range(STALE + 1)] == [True] * STALE + [False]
    assert fresh.keep(1, 6)  # moved again


def test_the_other_nodes_publish_and_node_0_compares_every_fresh_one() -> None:
    store = Store()
    nodes = [Across("127.0.0.1", 1, "job-7", n, 3, connect=store) for n in range(3)]  # type: ignore[arg-type]
    assert nodes[1].exchange({2: 0.9, 3: 0.1}) is None and nodes[2].exchange({4: 0.2}) is None
    assert store.data[key("job-7", 1)] == encode(1, 1, {2: 0.9, 3: 0.1}).encode()
    assert nodes[0].exchange({0: 0.1, 1: 0.1}) == {0: 0.1, 1: 0.1, 2: 0.9, 3: 0.1, 4: 0.2}
    assert nodes[0].nodes == {2: 1, 3: 1, 4: 2}
    for _ in range(STALE):  # node 2 stopped publishing, node 1 goes on
        nodes[1].exchange({2: 0.9, 3: 0.1})
        got = nodes[0].exchange({0: 0.1, 1: 0.1})
    assert got == {0: 0.1, 1: 0.1, 2: 0.9, 3: 0.1}
    assert not any(n.broken for n in nodes) and store.connections == 3 + 2 * STALE  # one a sample


def test_a_store_that_cannot_be_reached_leaves_node_0_to_its_own_ranks_with_no_other_try() -> None:
    port = free_port()  # nothing listens there
    node0, node1 = Across("127.0.0.1", port, "job-7", 0, 2), Across("127.0.0.1", port, "job-7", 1, 2)
    assert node0.exchange({0: 0.5}) == {0: 0.5} and node0.broken
    assert node1.exchange({1: 0.5}) is None and node1.broken
    assert node0.exchange({0: 0.4}) == {0: 0.4}  # at once: no connection tried again


def test_a_job_of_several_nodes_is_watched_even_with_one_rank_a_node(tmp_path: Path) -> None:
    one = job(tmp_path, Clock(), [], (slot(1),), straggler_window=5.0)
    assert Stragglers.start(one) is None
    watch = Stragglers.start(replace(one, plan=replace(one.plan, nnodes=2, node_rank=1)))
    assert watch is not None and watch.across is not None and watch.across.node == 1
