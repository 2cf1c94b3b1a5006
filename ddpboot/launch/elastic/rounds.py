"""One rendezvous round as this node sees it, and the node's plan for that round.

GPU selection and locks happen once per launcher; each round's plan is the node's reserved plan with the round's
global ranks, world size, node rank and node count. Global ranks follow torchrun: each node's ranks come after
those of the lower group ranks, so nodes may run different numbers of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ddpboot.selection.planner import Plan


@dataclass(frozen=True)
class Round:
    number: int | None  # torch's round counter (the same on every node), None if unknown
    group_rank: int
    nnodes: int
    rank_offset: int
    world_size: int
    master_addr: str
    master_port: int
    nodes: tuple[tuple[int, str], ...]  # (ranks, host) per group rank

    @classmethod
    def from_json(cls, msg: dict[str, Any]) -> Round:
        """The agent's answer to "next" (agent.py documents its fields)."""
        return cls(
            number=None if msg.get("round") is None else int(msg["round"]),
            group_rank=int(msg["group_rank"]),
            nnodes=int(msg["nnodes"]),
            rank_offset=int(msg["rank_offset"]),
            world_size=int(msg["world_size"]),
            master_addr=str(msg["master_addr"]),
            master_port=int(msg["master_port"]),
            nodes=tuple((int(n), str(h)) for n, h in msg["nodes"]),
        )

    def label(self, count: int) -> int:
        """How messages and log directories name the round: torch's number, else `count` (this node's rounds)."""
        return self.number if self.number is not None else count


def round_plan(plan: Plan, rnd: Round) -> Plan:
    """The node's reserved plan with this round's global ranks, world size, node rank and node count."""
    ranks = tuple(replace(s, rank=rnd.rank_offset + s.local_rank) for s in plan.ranks)
    cluster = {**plan.cluster, "round": rnd.number, "node_rank": rnd.group_rank, "nnodes": rnd.nnodes,
               "master_addr": rnd.master_addr, "master_port": rnd.master_port}
    return replace(plan, ranks=ranks, world_size=rnd.world_size, nnodes=rnd.nnodes, node_rank=rnd.group_rank,
                   cluster=cluster)
