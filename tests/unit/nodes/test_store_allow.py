"""Which hosts node 0's store serves (ddpboot.nodes.store_allow): the SLURM step's nodes, --store-allow added to
them, refused where torch's store would serve everyone anyway."""

from __future__ import annotations

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.launcher import NodeOptions, launcher_nodes
from ddpboot.nodes.static import resolve_nodes
from ddpboot.nodes.store_allow import parse_store_allow, slurm_job_hosts, store_allow_list
from tests.support import srun_env

NODE0 = srun_env(0, "localhost,127.0.0.5")  # the launcher on the first of two nodes


def test_under_slurm_node_0_serves_the_steps_nodes_only() -> None:
    nodes = resolve_nodes(NODE0)
    assert slurm_job_hosts(nodes, NODE0) == ["localhost", "127.0.0.5"]
    allow, notes = store_allow_list(nodes, NODE0, None, "python")
    assert notes == [] and allow is not None
    assert allow.allows("127.0.0.5") and not allow.allows("127.0.0.2") and not allow.allows("10.0.0.1")
    assert allow.origin == "the SLURM job's nodes localhost, 127.0.0.5"
    added, _ = store_allow_list(nodes, NODE0, parse_store_allow("10.0.0.0/8", nodes, "python"), "python")
    assert added is not None and added.allows("10.0.0.1") and added.allows("127.0.0.5")


def test_no_list_where_slurm_does_not_choose_the_store() -> None:
    flags = resolve_nodes(NODE0, master_addr="127.0.0.1")  # --master-addr: the nodes' routes are unknown
    assert store_allow_list(flags, NODE0, None, "python") == (None, [])
    assert store_allow_list(resolve_nodes(NODE0), NODE0, None, "torch") == (None, [])  # torch cannot check
    node1 = resolve_nodes({**NODE0, "SLURM_NODEID": "1", "SLURM_PROCID": "1"})
    assert store_allow_list(node1, NODE0, None, "python") == (None, [])  # its store serves nobody
    assert store_allow_list(resolve_nodes({}), {}, None, "python") == (None, [])


def test_a_node_that_does_not_resolve_leaves_the_store_open_and_says_so() -> None:
    env = {**NODE0, "SLURM_STEP_NODELIST": "localhost,no-such-host.invalid"}
    allow, notes = store_allow_list(resolve_nodes(env), env, None, "python")
    assert allow is None
    assert notes == ["the store serves every address: the job's node no-such-host.invalid does not resolve here, so "
                     "its address is unknown (give --store-allow to restrict it anyway)"]


def test_store_allow_is_refused_where_torchs_store_serves() -> None:
    static = resolve_nodes({}, 2, 0, "127.0.0.1", 29500)
    assert parse_store_allow(None, static, "python") is None and parse_store_allow(" ", static, "python") is None
    allow = parse_store_allow("127.0.0.3", static, "python")
    assert allow is not None and allow.allows("127.0.0.3") and not allow.allows("127.0.0.2")
    with pytest.raises(UsageError, match=r"--store-allow 127\.0\.0\.3 with --store torch"):
        parse_store_allow("127.0.0.3", static, "torch")
    elastic = launcher_nodes(NodeOptions(nnodes="1:2", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400"), {})
    with pytest.raises(UsageError, match="an elastic job"):
        parse_store_allow("127.0.0.3", elastic, "python")
