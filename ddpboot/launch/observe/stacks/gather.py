"""A multi-node job's verdict covers the whole job: after each of its dumps, the launcher of every node but node 0
writes where its ranks are (verdict.Seen and Left) into node 0's store, the one the job's ranks use; node 0's
launcher, when it dumps, reads the other nodes' latest entries and judges all ranks together, naming the node of the
rank to look at. The entries carry the flight recorder's dumps too (each rank dumps into its own node's attempt
directory), so that its verdict also compares the ranks of every node. An entry older than FRESH seconds describes
an earlier moment and is left out (the verdict then says which nodes did not answer); node 0 waits up to WAIT
seconds for entries that are not there yet (at a stall every node's launcher dumps at about the same time). Best
effort: a store that cannot be reached leaves the verdict to this node's ranks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ddpboot.launch.observe.stacks.flight import Flight, from_json, to_json
from ddpboot.launch.observe.stacks.summary import Wait
from ddpboot.launch.observe.stacks.verdict import Left, Seen
from ddpboot.tcpstore.client import StoreClient

FRESH = 60.0  # seconds an entry describes the job's present
WAIT = 3.0  # seconds node 0 waits for the other nodes' entries
CONNECT = 2.0  # seconds to reach the store


@dataclass(frozen=True)
class NodeReport:
    """Where one node's ranks were at its last dump."""

    node: int
    host: str
    seen: tuple[Seen, ...]
    left: tuple[Left, ...]
    at: float  # time.time() of the dump
    flight: Flight | None = None  # its ranks' flight recorder dumps (flight.py); encode() keeps to_json's part


def key(run_id: str, node: int) -> str:
    return f"ddpboot/stacks/{run_id}/node{node}"


def encode(report: NodeReport) -> bytes:
    return json.dumps({"node": report.node, "host": report.host, "at": report.at,
                       "seen": [{"rank": s.rank, "wait": asdict(s.wait) if s.wait else None, "node": s.node}
                                for s in report.seen],
                       "left": [asdict(x) for x in report.left],
                       "flight": to_json(report.flight) if report.flight is not None else None}).encode()


def decode(data: bytes) -> NodeReport:
    d = json.loads(data)
    return NodeReport(int(d["node"]), str(d["host"]),
                      tuple(Seen(int(s["rank"]), Wait(**s["wait"]) if s["wait"] else None, s["node"])
                            for s in d["seen"]),
                      tuple(Left(**x) for x in d["left"]), float(d["at"]),
                      from_json(d["flight"]) if d.get("flight") else None)


def publish(host: str, port: int, run_id: str, report: NodeReport) -> str | None:
    """Write this node's report into node 0's store; why not, or None."""
    try:
        with StoreClient(host, port, connect_timeout=CONNECT) as store:
            store.set(key(run_id, report.node), encode(report))
            store.check([key(run_id, report.node)])  # the set has been applied before the connection closes
    except (OSError, ValueError) as exc:
        return f"cannot write this node's stacks summary into the store at {host}:{port}: {exc}"
    return None


def gather(host: str, port: int, run_id: str, nodes: Sequence[int], since: float,
           wait: float = WAIT) -> tuple[list[NodeReport], list[int]]:
    """The other nodes' reports written at `since` or later (waiting up to `wait` s for them), and the nodes
    without one."""
    got: dict[int, NodeReport] = {}
    deadline = time.monotonic() + wait
    try:
        with StoreClient(host, port, connect_timeout=CONNECT) as store:
            while True:
                for node in nodes:
                    if node not in got and store.check([key(run_id, node)]):
                        report = decode(store.multi_get([key(run_id, node)])[0])
                        if report.at >= since:
                            got[node] = report
                if len(got) == len(nodes) or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)  # polling the store for keys other launchers write at their own dumps
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass  # an entry of another shape (another version's launcher) counts as none
    return [got[n] for n in sorted(got)], [n for n in nodes if n not in got]
