"""The straggler watch of a job of several nodes: node 0 compares every node's ranks, through its store.

At each sample every other node writes its ranks' CPU shares of the last interval into node 0's store (the one the
job's ranks use; key `ddpboot/straggler/RUN_ID/nodeN`, with a count of its samples); node 0 reads the other nodes'
and judges them with its own (straggler.py), naming a rank of any node. A node whose count has not moved for
STALE of node 0's samples (it ended, or cannot reach the store) is left out until it moves again. Best effort, as
the stacks' gathering (stacks/gather.py): a store that cannot be reached leaves node 0 to judge its own ranks (and
the other nodes to say nothing), with no other try.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ddpboot.launch.observe.base import Job
from ddpboot.tcpstore.client import StoreClient

CONNECT = 0.5  # seconds to reach the store (once: a store that went ends the tries; the loop waits no longer)
STALE = 3  # node 0's samples without a new one from a node before its ranks are left out


def key(run_id: str, node: int) -> str:
    return f"ddpboot/straggler/{run_id}/node{node}"


def encode(node: int, count: int, shares: Mapping[int, float]) -> str:
    return json.dumps({"node": node, "count": count, "shares": {str(r): round(s, 4) for r, s in shares.items()}})


def decode(data: bytes) -> tuple[int, int, dict[int, float]] | None:
    """(node, count, shares) as encoded; None for anything else."""
    try:
        got = json.loads(data)
        return int(got["node"]), int(got["count"]), {int(r): float(s) for r, s in got["shares"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


@dataclass
class Fresh:
    """Node 0's view of the other nodes: each one's last count and for how many samples it has not moved."""

    seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # node → (count, samples unchanged)

    def keep(self, node: int, count: int) -> bool:
        """Whether `node`'s record (its count now) is recent enough to be compared."""
        last, still = self.seen.get(node, (-1, 0))
        still = still + 1 if count == last else 0
        self.seen[node] = (count, still)
        return still < STALE


class Across:
    """One node's side: `exchange` publishes this node's shares (node N > 0: and nothing to judge) or, on node 0,
    returns every fresh node's with its own. `nodes`: the other nodes' ranks, rank → node (for the line's words)."""

    def __init__(self, host: str, port: int, run_id: str, node: int, nnodes: int,
                 connect: Callable[[str, int, float], StoreClient] = StoreClient) -> None:
        self.host, self.port, self.run_id, self.node, self.nnodes = host, port, run_id, node, nnodes
        self.connect = connect
        self.broken = False  # the store could not be reached: each node judges alone from then on
        self.count = 0
        self.fresh = Fresh()
        self.nodes: dict[int, int] = {}

    @classmethod
    def start(cls, job: Job) -> Across | None:
        if job.plan.nnodes < 2:
            return None
        return cls(job.spec.master_addr, job.port, job.spec.run_id, job.plan.node_rank, job.plan.nnodes)

    def exchange(self, shares: Mapping[int, float]) -> dict[int, float] | None:
        """This node's interval out; on node 0 every fresh node's in (with this node's), elsewhere None. One short
        connection a sample (as the stacks' gathering): the store's open files hold one per node, the check-in's."""
        self.count += 1
        own = dict(shares) if self.node == 0 else None
        if self.broken:
            return own
        try:
            with self.connect(self.host, self.port, CONNECT) as store:
                if self.node != 0:
                    store.set(key(self.run_id, self.node), encode(self.node, self.count, shares))
                    store.check([key(self.run_id, self.node)])  # applied before the connection closes
                    return None
                return self._gather(store, shares)
        except OSError:  # the store cannot be reached, or went (the job ends): no other try, each try could hold
            self.broken = True  # the loop for CONNECT seconds
            return own

    def _gather(self, store: StoreClient, shares: Mapping[int, float]) -> dict[int, float]:
        merged = dict(shares)
        for node in range(1, self.nnodes):
            k = key(self.run_id, node)
            got = decode(store.multi_get([k])[0]) if store.check([k]) else None
            if got is not None and got[0] == node and self.fresh.keep(node, got[1]):
                merged.update(got[2])
                self.nodes.update(dict.fromkeys(got[2], node))
        return merged

