"""Which hosts may reach node 0's store: `--store-allow`, and under SLURM the job's own nodes.

A multi-node job's store listens on node 0's routable address, where every host that reaches it could otherwise
write the job's keys. Under SLURM the step's node list is known before anyone connects, so node 0 serves only the
addresses those nodes resolve to (and its own address, which its ranks connect from). `--store-allow HOST[,...]`
(addresses, CIDR networks, names) names them where SLURM does not, or adds networks the names do not cover (nodes
that reach node 0 through another interface than the one their name resolves to).

Only ddpboot's store can check addresses: torch's TCPStore server (`--store torch`, and the c10d rendezvous of an
elastic job) serves everyone, so `--store-allow` with either is refused rather than silently ignored.
docs/security.md says what is and is not protected.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpboot.cluster.slurm import slurm_main_address, slurm_node_list
from ddpboot.errors import DdpbootError, UsageError
from ddpboot.nodes.static import NodeSetup, NodeSource
from ddpboot.tcpstore.allow import AllowList, hosts_allow_list, parse_allow_list, resolve_host


def parse_store_allow(text: str | None, nodes: NodeSetup, backend: str) -> AllowList | None:
    """`--store-allow` as given (None or empty: not given), refused where the store cannot apply it."""
    if not text or not text.strip():
        return None
    if nodes.elastic:
        raise UsageError(
            f"--store-allow {text}: an elastic job (--nnodes MIN:MAX) meets through torch's c10d rendezvous store, "
            "which serves every host and cannot check addresses. Drop --store-allow, or run a fixed node count "
            "(--nnodes N), whose store is ddpboot's."
        )
    if backend == "torch":
        raise UsageError(
            f"--store-allow {text} with --store torch: torch's TCPStore server serves every host and cannot check "
            "addresses. Drop --store torch (ddpboot's store applies the list) or drop --store-allow."
        )
    return parse_allow_list(text)


def slurm_job_hosts(nodes: NodeSetup, env: Mapping[str, str]) -> list[str] | None:
    """The step's host names when node 0's store address is SLURM's own choice (its first node); else None."""
    if nodes.source is not NodeSource.SLURM or nodes.nnodes < 2:
        return None
    try:
        if slurm_main_address(env) != nodes.master_addr:  # --master-addr chose another address: routes unknown
            return None
        return slurm_node_list(env)
    except DdpbootError:  # no node list, or one that cannot be read
        return None


def store_allow_list(
    nodes: NodeSetup, env: Mapping[str, str], given: AllowList | None, backend: str
) -> tuple[AllowList | None, list[str]]:
    """What node 0's store serves: the SLURM job's hosts (with ddpboot's store), plus `given`; and notes to say.

    A job host whose name does not resolve here would be shut out; rather than hang the job, the store then serves
    every address (as without the list) and a note says why."""
    hosts = slurm_job_hosts(nodes, env) if backend == "python" else None
    if hosts is None or nodes.node_rank != 0:
        return given, []
    job, unresolved = hosts_allow_list(hosts, f"the SLURM job's nodes {', '.join(hosts)}")
    if unresolved:
        return given, [
            f"the store serves every address: the job's node {', '.join(unresolved)} does not resolve here, so its "
            "address is unknown (give --store-allow to restrict it anyway)"
        ]
    own = resolve_host(nodes.master_addr)  # node 0's own ranks connect from the store's address
    return AllowList(tuple(dict.fromkeys((*job.networks, *own))), job.origin).merged(given), []
