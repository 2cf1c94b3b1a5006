"""A rendezvous round as the agent describes it, and the node's plan for it (ddpboot.launch.elastic.rounds)."""

from __future__ import annotations

from ddpboot.contract import Isolation
from ddpboot.launch.elastic.rounds import Round, round_plan
from ddpboot.selection.planner import Plan, RankSlot


def test_a_round_from_the_agents_answer() -> None:
    msg = {"re": "next", "round": 4, "group_rank": 1, "nnodes": 2, "rank_offset": 3, "world_size": 5,
           "master_addr": "10.0.0.1", "master_port": 29500, "nodes": [[3, "a"], [2, "b"]]}
    rnd = Round.from_json(msg)
    assert rnd == Round(4, 1, 2, 3, 5, "10.0.0.1", 29500, ((3, "a"), (2, "b")))
    assert rnd.label(9) == 4
    unnumbered = Round.from_json({**msg, "round": None})
    assert unnumbered.number is None and unnumbered.label(9) == 9


def test_the_rounds_plan_keeps_the_nodes_gpus_with_the_rounds_ranks() -> None:
    slots = tuple(RankSlot(rank=i, local_rank=i, gpus=(), cuda_visible_devices=str(i), device="cuda:0")
                  for i in range(2))
    plan = Plan(ranks=slots, world_size=4, nnodes=2, node_rank=0, isolation=Isolation.RANK, backend="nccl",
                cluster={"source": "elastic"})
    rnd = Round(7, 1, 3, 3, 7, "10.0.0.1", 29500, ((3, "a"), (2, "b"), (2, "c")))
    out = round_plan(plan, rnd)
    assert [(s.rank, s.local_rank, s.cuda_visible_devices) for s in out.ranks] == [(3, 0, "0"), (4, 1, "1")]
    assert (out.world_size, out.nnodes, out.node_rank) == (7, 3, 1)
    assert out.cluster == {"source": "elastic", "round": 7, "node_rank": 1, "nnodes": 3, "master_addr": "10.0.0.1",
                           "master_port": 29500}
    assert plan.ranks[0].rank == 0  # the reserved plan itself is unchanged
