"""The launcher's side of an elastic job (`--nnodes MIN:MAX`): its options checked, and what this node will do.

An elastic job runs through torch's c10d rendezvous (launch/elastic/), which decides the node rank, the world size
and the store's address at each round. Everything here is checked before anything starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket

from ddpboot.errors import UsageError
from ddpboot.nodes.static import (
    DEFAULT_RDZV_PORT,
    NodeSetup,
    RdzvBackend,
    check_resolvable,
    elastic_setup,
    parse_endpoint,
)
from ddpboot.tcpstore.address import bind_store_socket, is_loopback


def elastic_nodes(
    text: str,
    low: int,
    high: int,
    endpoint: str,
    *,
    standalone: bool = False,
    rdzv_backend: RdzvBackend = RdzvBackend.C10D,
    ranks_filter: str | None = None,
    local_addr: str | None = None,
    ignored_options: tuple[str, ...] = (),
) -> NodeSetup:
    """Check an elastic range's options (exit 2 on anything wrong, nothing started) and describe the node.

    `ignored_options` are the options given on the command line that an elastic job does not use (the rendezvous
    numbers the nodes and chooses the store's address); they are reported in a note."""
    if standalone:
        raise UsageError(f"--standalone is a one-node job and --nnodes {text} an elastic range; drop one of them.")
    problems = ([f"--rdzv-backend is {rdzv_backend}"] if rdzv_backend != RdzvBackend.C10D else []) + (
        ["--rdzv-endpoint is missing"] if not endpoint.strip() else [])
    if problems:
        raise UsageError(
            f"--nnodes {text} is an elastic range, which runs through torch's c10d rendezvous: pass --rdzv-backend "
            "c10d and --rdzv-endpoint HOST:PORT (the same on every node; HOST is the node that hosts the "
            f"rendezvous). Here {' and '.join(problems)}."
        )
    host, port = parse_endpoint(endpoint)
    if not host:
        raise UsageError(f"--rdzv-endpoint {endpoint!r} names no host; give HOST:PORT (one of the nodes).")
    port = port or DEFAULT_RDZV_PORT
    if ranks_filter:
        raise UsageError(
            "--ranks-filter names global ranks, which an elastic job only knows once each rendezvous round has "
            "formed; use --local-ranks-filter (this node's ranks) instead."
        )
    ip = check_resolvable(host, option="--rdzv-endpoint")
    local = local_addr
    if local:
        store_addr = "127.0.0.1" if is_loopback(local) else str(local)
        try:
            bind_store_socket(store_addr, None).close()
        except UsageError:
            raise UsageError(
                f"--local-addr {local} is not an address of this machine: it is where this node serves the workers' "
                "store when it is group rank 0. Give an address of this machine that the other nodes reach."
            ) from None
    else:
        store_addr = default_store_addr(host, ip, port)
    notes = [
        f"elastic job: this node joins rounds of {low} to {high} nodes at the c10d rendezvous {host}:{port}; its "
        "node rank, global ranks, world size and MASTER_ADDR/MASTER_PORT are decided at each round (shown here as "
        f"node 0 of {high})"
    ]
    if ignored_options:
        notes.append(f"{', '.join(ignored_options)} not used through the c10d rendezvous (torchrun ignores them "
                     "there too): the rendezvous numbers the nodes, and group rank 0 serves the workers' store on its "
                     "--local-addr and a free port")
    return elastic_setup(low, high, f"{host}:{port}", store_addr, tuple(notes))


def default_store_addr(host: str, ip: str, port: int) -> str:
    """Where this node serves the workers' store as node rank 0 of a round, without --local-addr: 127.0.0.1 for a
    loopback endpoint (every node on this machine); otherwise this machine's address on the route to the endpoint
    (what the other nodes most likely reach), or its first non-loopback address when the endpoint's name resolves to
    loopback here (Debian maps the host's own name to 127.0.1.1)."""
    if is_loopback(host):
        return "127.0.0.1"
    addr = ""
    if not ipaddress.ip_address(ip).is_loopback:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, port))  # UDP: no packet is sent, the kernel only picks the route
            addr = str(s.getsockname()[0])
    if not addr or ipaddress.ip_address(addr).is_loopback:
        import psutil

        for nics in psutil.net_if_addrs().values():
            for nic in nics:
                if nic.family == socket.AF_INET and not ipaddress.ip_address(nic.address).is_loopback:
                    return str(nic.address)
        return addr or "127.0.0.1"
    return addr


def default_run_id(endpoint: str) -> str:
    """The same on every node without talking first: the endpoint names the job (torchrun's default is 'none')."""
    return "elastic-" + endpoint.replace(":", "-").replace("[", "").replace("]", "")
