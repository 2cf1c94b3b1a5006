"""The nodes' check-in settings (ddpboot/nodes/check.py); the check-in itself runs against a real store in
tests/unit/tcpstore/test_client.py."""

from __future__ import annotations

import threading

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.check import DEFAULT_JOIN_TIMEOUT, check_nodes, join_timeout


def test_join_timeout_comes_from_the_rendezvous_settings() -> None:
    assert join_timeout({}) == DEFAULT_JOIN_TIMEOUT == 600.0
    assert join_timeout({"join_timeout": "12.5", "timeout": "900"}) == 12.5


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_join_timeout_must_be_positive_seconds(value: str) -> None:
    with pytest.raises(UsageError, match=f"--rdzv-conf join_timeout={value}: give a number of seconds above 0"):
        join_timeout({"join_timeout": value})


# --- the nodes' check-in through a real store ------------------------------------------------


def check_all(port: int, sizes: list[int], ranks: list[int] | None = None, timeout: float = 30) -> list[str]:
    """Run check_nodes for every node in threads; each node's outcome: "ok" or its error message."""
    ranks = ranks if ranks is not None else list(range(len(sizes)))
    out = [""] * len(sizes)

    def node(i: int) -> None:
        try:
            check_nodes("127.0.0.1", port, len(sizes), ranks[i], sizes[i], timeout=timeout, host=f"h{i}")
            out[i] = "ok"
        except UsageError as exc:
            out[i] = str(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(len(sizes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_nodes_that_agree_pass(store_port: int) -> None:
    assert check_all(store_port, [2, 2, 2]) == ["ok", "ok", "ok"]


def test_mismatched_rank_counts_are_reported_on_every_node(store_port: int) -> None:
    out = check_all(store_port, [2, 1])
    for msg in out:
        assert "node 0 (h0): 2, node 1 (h1): 1" in msg and "same --nproc" in msg


def test_a_node_that_never_comes_is_reported_by_the_deadline(store_port: int) -> None:
    with pytest.raises(UsageError, match=r"node 1 of 2 did not join .* within 0.3 s"):
        check_nodes("127.0.0.1", store_port, 2, 0, 2, timeout=0.3)


def test_two_launchers_claiming_one_node_rank_are_reported(store_port: int) -> None:
    out = check_all(store_port, [2, 2, 2], ranks=[0, 1, 1], timeout=1)
    assert any("two launchers claimed node rank 1" in msg for msg in out), out
    assert "ok" not in out[1:]
