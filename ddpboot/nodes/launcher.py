"""The node setup a launcher runs with, from its node options: one node, a fixed node count, or an elastic range.

Every check here runs before anything starts and exits 2 with one message. Option values arrive explicit: None for
an option that was not given, so that a scheduler (or one node) supplies it; a default is never mistaken for a
choice.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ddpboot.cluster.parallel import unknown_launch
from ddpboot.cluster.slurm import in_srun_step, slurm_step
from ddpboot.errors import UsageError
from ddpboot.nodes.elastic import default_run_id, elastic_nodes
from ddpboot.nodes.static import (
    LOOPBACK,
    UNKNOWN_LAUNCH_FIX,
    NodeSetup,
    NodeSource,
    RdzvBackend,
    check_port,
    check_resolvable,
    parse_endpoint,
    parse_node_range,
    resolve_nodes,
    scheduler_span,
)
from ddpboot.tcpstore.address import bind_store_socket, is_loopback, store_host

SEVERAL_NODES_HINT = (
    "for several nodes give --nnodes N with --node-rank and --master-addr (a fixed node count, or srun under SLURM), "
    "or --nnodes MIN:MAX with --rdzv-backend c10d --rdzv-endpoint HOST:PORT (an elastic job)."
)


@dataclass(frozen=True)
class NodeOptions:
    """The launcher's node and store options, None where not given (torchrun's names and meanings)."""

    nnodes: str | None = None  # N, or MIN:MAX (elastic); None: SLURM's node count, else 1
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str = ""
    rdzv_backend: str = RdzvBackend.STATIC.value  # as typed; RdzvBackend.parse reads it, once
    standalone: bool = False
    local_addr: str | None = None
    step: str = ""  # what the launchers of one scheduler step share (their command): a pbsdsh step's port


@dataclass(frozen=True)
class StoreAddress:
    """Where this launcher's store listens, and the MASTER_ADDR/MASTER_PORT its workers get."""

    bind_addr: str
    master_addr: str
    port: int | None  # None: a free port, bound by the launcher itself (no race between choice and use)


def launcher_nodes(
    options: NodeOptions, env: Mapping[str, str], max_restarts: int = 0, ranks_filter: str | None = None
) -> NodeSetup:
    """Node count, node rank and store address: flags > a scheduler's one task per node (MPI, jsrun, a SLURM step,
    pbsdsh: nodes/static.py) > one node. For several
    nodes, `--rdzv-endpoint HOST:PORT` stands for --master-addr/--master-port as in torchrun, and the master address
    must resolve now: a name that does not would make every worker hang. An elastic range (MIN:MAX) goes to torch's
    c10d rendezvous (launch/elastic/), which decides the node rank at each round."""
    text = "1" if options.nnodes is None else options.nnodes
    low, high = parse_node_range(text)
    backend = RdzvBackend.parse(options.rdzv_backend, "--rdzv-backend")
    if low != high or _rendezvous_numbers_nodes(options, backend, low, env):
        unused = {"--node-rank": options.node_rank, "--master-addr": options.master_addr,
                  "--master-port": options.master_port}
        return elastic_nodes(text.strip(), low, high, options.rdzv_endpoint, standalone=options.standalone,
                             rdzv_backend=backend, ranks_filter=ranks_filter,
                             local_addr=options.local_addr,
                             ignored_options=tuple(flag for flag, value in unused.items() if value is not None))
    if options.standalone:
        _check_one_node(text, low, env, "--standalone")
        return resolve_nodes({})
    if options.nnodes is not None and low == 1:
        _check_one_node(text, low, env, f"--nnodes {text.strip()}")
    nodes = _fixed_nodes(options, None if options.nnodes is None else low, env)
    if nodes.nnodes == 1:
        return nodes
    if max_restarts:
        raise UsageError(
            f"--max-restarts {max_restarts} with {nodes.nnodes} nodes: restarting needs every node to agree on a new "
            "round, which static multi-node jobs do not have yet. Drop --max-restarts (under SLURM, requeue the job: "
            "scripts/slurm/requeue.sbatch), or restart on one node."
        )
    check_resolvable(nodes.master_addr, timeout=5.0, option=nodes.master_addr_option)
    return nodes


def _rendezvous_numbers_nodes(options: NodeOptions, backend: RdzvBackend, count: int, env: Mapping[str, str]) -> bool:
    """A fixed node count through c10d (torchrun's `--nnodes N --rdzv-backend c10d --rdzv-endpoint H:P`): the
    rendezvous numbers the nodes, as for the range N:N, and --node-rank / --master-addr are not used (torchrun
    ignores them there too, with a warning). Inside a SLURM step, which numbers the nodes itself, the endpoint
    stands for node 0's store address instead."""
    return count > 1 and backend is RdzvBackend.C10D and bool(options.rdzv_endpoint) and not in_srun_step(env)


def _fixed_nodes(options: NodeOptions, nnodes: int | None, env: Mapping[str, str]) -> NodeSetup:
    """A fixed node count: the flags, where --rdzv-endpoint HOST:PORT stands for --master-addr / --master-port as
    torchrun's static rendezvous reads it (the flags win where both are given), else a scheduler, else one node."""
    addr, port = options.master_addr, options.master_port
    if not options.rdzv_endpoint or nnodes == 1:
        return resolve_nodes(env, nnodes, options.node_rank, addr, port, options.step)
    host, endpoint_port = parse_endpoint(options.rdzv_endpoint)
    nodes = resolve_nodes(env, nnodes, options.node_rank, addr or host or None, port or endpoint_port, options.step)
    if addr is None and host and nodes.master_addr == host:
        nodes = replace(nodes, addr_option="--rdzv-endpoint")
    return nodes


def _check_one_node(text: str, count: int, env: Mapping[str, str], given: str) -> None:
    """`--standalone` (or `--nnodes 1`, `given`) is one node; torchrun writes a fixed node count as `1:1`."""
    if count > 1:
        shown = str(count) if ":" in text else text.strip()
        raise UsageError(f"--nnodes {shown} with --standalone, a one-node job: drop --standalone; {SEVERAL_NODES_HINT}")
    # Inside `srun -N2 ddpboot ...` or `mpirun -np 2 ddpboot ...` each launcher would otherwise run a world of its own.
    span = scheduler_span(env)
    if span is not None:
        what, fix = span
        raise UsageError(f"{given}, but {what}: each would run a job of its own. Drop {given.split()[0]}: {fix}.")
    unknown = unknown_launch(env, "this ddpboot launcher")
    if unknown is not None:
        raise UsageError(f"{given}, but {unknown}. {UNKNOWN_LAUNCH_FIX}")


def store_address(nodes: NodeSetup, options: NodeOptions) -> StoreAddress:
    """Several nodes: node 0's address and port. One node: loopback unless --master-addr names another address of
    this machine (then the store listens there only, not on every interface as torchrun's does)."""
    if nodes.nnodes > 1:
        addr = nodes.master_addr
        return StoreAddress(addr, store_host(addr), nodes.master_port)
    port = options.master_port
    if port is not None:
        check_port(port, "--master-port")
    endpoint = options.rdzv_endpoint
    if endpoint and not options.standalone:
        host, endpoint_port = parse_endpoint(endpoint)
        if host and not is_loopback(host) and host not in (socket.gethostname(), socket.getfqdn()):
            raise UsageError(
                f"--rdzv-endpoint {endpoint}: {host} is another host, and a one-node job serves its store here. "
                f"Drop --rdzv-endpoint (or give localhost:PORT); {SEVERAL_NODES_HINT}"
            )
        if endpoint_port and port is None:
            port = endpoint_port
    addr = store_host(options.master_addr or LOOPBACK)
    return StoreAddress(addr, addr, port or None)


def bind_node_store(nodes: NodeSetup, store: StoreAddress, listeners: int = 1) -> socket.socket:
    """The store's socket: on the master address for node 0 (or one node), `listeners` sockets of one port where
    one listen queue cannot hold every connection at once; on other nodes a private loopback one that nobody uses,
    since their workers connect to node 0's."""
    if nodes.node_rank != 0:
        return bind_store_socket(LOOPBACK, None)
    try:
        return bind_store_socket(store.bind_addr, store.port, listeners=listeners)
    except UsageError as exc:
        if nodes.port_from and "is in use" in str(exc):
            raise UsageError(
                f"port {store.port} on {store.bind_addr}, {nodes.port_from}, is in use: another step of this job "
                "that runs the same command at the same time? Give each step its own port, the same on every "
                "launcher of the step: MASTER_PORT=PORT before ddpboot in the command pbsdsh runs."
            ) from None
        if nodes.nnodes == 1 or "not an address of this machine" not in str(exc):
            raise
        option = nodes.master_addr_option
        raise UsageError(
            f"{option} {store.bind_addr} is not an address of this machine, and this is node 0 (--node-rank 0), "
            f"which serves the job's store on that address. Run node rank 0 on the machine that has that "
            f"address, or give an address of this machine as {option} on every node."
        ) from None


def job_run_id(given: str | None, nodes: NodeSetup, env: Mapping[str, str]) -> str:
    """The job's run id (TORCHELASTIC_RUN_ID, the --log-dir folder, the elastic rendezvous id): --rdzv-id as given
    (torchrun's default id, the string `none`, counts as not given), else a fresh one. A fresh id for one node is
    unique; on several nodes every launcher must give its workers the same id without talking first: the
    rendezvous endpoint (elastic), the SLURM job and step ids, else the store's address."""
    if given and given != "none":
        return given
    if nodes.elastic and nodes.rdzv_endpoint:
        return default_run_id(nodes.rdzv_endpoint)
    if nodes.nnodes > 1:
        step = slurm_step(env) if nodes.source is NodeSource.SLURM else None
        if step is not None:
            return f"slurm-{step}"
        return f"nodes-{nodes.master_addr}-{nodes.master_port}"
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
