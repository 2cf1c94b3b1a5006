"""An elastic range's options, checked before anything starts (ddpboot/nodes/elastic.py)."""

from __future__ import annotations

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.elastic import default_run_id, default_store_addr, elastic_nodes


def test_an_elastic_node_is_planned_as_node_0_of_max() -> None:
    nodes = elastic_nodes("1:3", 1, 3, "127.0.0.1")
    assert (nodes.source, nodes.nnodes, nodes.node_rank, nodes.rdzv_endpoint, nodes.master_addr) == (
        "elastic", 3, 0, "127.0.0.1:29400", "127.0.0.1")
    assert nodes.notes[0].startswith("elastic job: this node joins rounds of 1 to 3 nodes")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rdzv_backend": "static"}, "Here --rdzv-backend is static"),
        ({"endpoint": " "}, "Here --rdzv-endpoint is missing"),
        ({"endpoint": ":29400"}, "names no host"),
        ({"local_addr": "10.99.99.99"}, "--local-addr 10.99.99.99 is not an address of this machine"),
        ({"standalone": True}, "--standalone is a one-node job and --nnodes 1:2 an elastic range"),
    ],
)
def test_bad_elastic_options(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"endpoint": "127.0.0.1:29400", **kwargs}
    endpoint = str(args.pop("endpoint"))
    with pytest.raises(UsageError, match=message):
        elastic_nodes("1:2", 1, 2, endpoint, **args)  # type: ignore[arg-type]


def test_every_node_derives_the_same_run_id_from_the_endpoint() -> None:
    assert default_run_id("node1:29400") == "elastic-node1-29400"
    assert default_run_id("[::1]:29400") == "elastic---1-29400"


def test_a_loopback_endpoint_serves_the_store_on_loopback() -> None:
    assert default_store_addr("localhost", "127.0.0.1", 29400) == "127.0.0.1"
