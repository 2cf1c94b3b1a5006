"""Before a multi-node job starts its workers, every node's launcher checks, through node 0's store, that the nodes
agree: each publishes its local world size and host, waits (with a deadline) until every node has, and compares.

Why: ddpboot numbers ranks as node_rank * nproc + local rank, so every node must run the same number of ranks. A node
with fewer GPUs (a drained GPU, a different `--nproc`, another CUDA_VISIBLE_DEVICES) would otherwise give a world
whose ranks overlap or leave gaps, and the workers would wait in init_process_group for ranks that never come
(30 minutes by default) or fail with a confusing error. Two launchers claiming one node rank (a wrong
`--node-rank`, or srun starting two per node) would do the same. Checked here, each node's launcher exits 2 with one
message naming every node and its count, before any worker exists.

The keys live outside the workers' namespace: torch's clients put "/" before every key, these do not.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ddpboot.errors import UsageError
from ddpboot.tcpstore.client import StoreClient, StoreGone, StoreTimeout

if TYPE_CHECKING:
    from ddpboot.nodes.netprobe import NetCheck

PREFIX = "ddpboot/nodes"
DEFAULT_JOIN_TIMEOUT = 600.0  # torchrun's rendezvous join_timeout default, and its --rdzv-conf key
READ_TIMEOUT = 30.0  # how long node 0 keeps the store up for the others to read the check-in (they are already in)


def join_timeout(rdzv_conf: Mapping[str, str]) -> float:
    """How long nodes wait for each other before starting workers (torchrun's --rdzv-conf join_timeout)."""
    text = rdzv_conf.get("join_timeout")
    if text is None:
        return DEFAULT_JOIN_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"--rdzv-conf join_timeout={text}: give a number of seconds above 0 (default 600).")
    return value


def check_nodes(
    master_addr: str,
    master_port: int,
    nnodes: int,
    node_rank: int,
    local_world_size: int,
    timeout: float = DEFAULT_JOIN_TIMEOUT,
    host: str | None = None,
    tick: Callable[[Callable[[], str]], None] | None = None,
    hint: str = "",
    network: NetCheck | None = None,
) -> None:
    """Publish this node's size, wait for all `nnodes`, raise UsageError if they disagree or do not all come.
    `tick(what)` is called at least twice a second while waiting (it may raise to end the wait); `what()` says what
    the wait is for. `hint`: how every node's launcher is started (NodeSetup.start_hint), for the messages.
    `network`: this node's part of the network check (nodes/netprobe.py), run once every node is in; closed here."""
    try:
        _check_nodes(master_addr, master_port, nnodes, node_rank, local_world_size, timeout, host, tick, hint,
                     network)
    finally:
        if network is not None:
            network.close()


def _check_nodes(master_addr: str, master_port: int, nnodes: int, node_rank: int, local_world_size: int,
                 timeout: float, host: str | None, tick: Callable[[Callable[[], str]], None] | None, hint: str,
                 network: NetCheck | None) -> None:
    hint = hint or (f"start one ddpboot per node with the same --nnodes, --master-addr and --master-port and node "
                    f"ranks 0..{nnodes - 1}")
    host = host or socket.gethostname()
    where = f"{master_addr}:{master_port}"
    _tick = _ticker(tick)
    unreachable = _store_name_note(master_addr) if network is not None and node_rank == 0 else None
    found: list[str] = []
    try:
        client = StoreClient(master_addr, master_port, connect_timeout=timeout, tick=_tick(
            lambda: f"node {node_rank} of {nnodes} waiting for node 0's store at {where} (node 0's launcher serves "
                    f"it) for up to {timeout:g} s"))
    except StoreGone as exc:
        raise UsageError(
            f"node {node_rank}: no store answers at {where} ({exc}). Node 0's launcher serves it: start it with the "
            "same --master-addr/--master-port, and check that this node can reach that address."
        ) from None
    with client:
        try:
            claims = client.add(f"{PREFIX}/{node_rank}/claims", 1)
            if network is not None:  # before the entry: a node that sees the entry finds the report too
                network.publish(client, PREFIX)
            client.set(f"{PREFIX}/{node_rank}", f"{local_world_size} {host}")
            keys = [f"{PREFIX}/{r}" for r in range(nnodes)]

            def missing_nodes() -> str:
                missing = [r for r in range(nnodes) if not client.check([f"{PREFIX}/{r}"])]
                return (f"node {node_rank} of {nnodes} ({host}) waiting at {where} for node"
                        f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} to join, for up to "
                        f"{timeout:g} s (--rdzv-conf join_timeout=SECONDS){f'; {unreachable}' if unreachable else ''}")

            try:
                client.wait(keys, timeout, tick=_tick(missing_nodes))
            except StoreTimeout:
                missing = [r for r in range(nnodes) if not client.check([f"{PREFIX}/{r}"])]
                claimed = [r for r in range(nnodes) if client.check([f"{PREFIX}/{r}/claims"])]
                _check_claims([r for r in claimed if int(client.get(f"{PREFIX}/{r}/claims")) > 1], nnodes, where,
                              hint)
                raise UsageError(
                    f"node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {nnodes} did not join "
                    f"the store at {where} within {timeout:g} s, so no worker was started. "
                    f"{f'{unreachable}. Else e' if unreachable else 'E'}very node's launcher must start: {hint} (or "
                    "raise the deadline: --rdzv-conf join_timeout=SECONDS)."
                ) from None
            # Every node's entry and claim count in one request (each node added its claim before its entry): a
            # GET per key would be 4 × nnodes round trips per node, 4 × nnodes² requests to node 0's store.
            values = client.multi_get(keys + [f"{PREFIX}/{r}/claims" for r in range(nnodes)])
            sizes = {}
            for r in range(nnodes):
                count, _, where_r = values[r].decode().partition(" ")
                sizes[r] = (int(count), where_r)
            dup = [r for r in range(nnodes) if int(values[nnodes + r]) > 1]
            if network is not None and not dup and claims <= 1 and len({c for c, _ in sizes.values()}) == 1:
                found = network.run(client, _tick(lambda: f"node {node_rank} of {nnodes} checking that every node "
                                                          "can reach the others' bootstrap addresses"))
            # Node 0's store must outlive everyone's reading: if node 0 found a mismatch and exited at once, the
            # others would only see the store vanish. So each node says it has read, and node 0 waits for that.
            client.set(f"{PREFIX}/{node_rank}/read", "1")
            if node_rank == 0:
                with contextlib.suppress(StoreTimeout):
                    client.wait([f"{PREFIX}/{r}/read" for r in range(nnodes)], READ_TIMEOUT, tick=_tick(
                        lambda: f"node 0 waiting for the other nodes to read the check-in at {where}"))
        except StoreGone as exc:
            raise UsageError(
                f"node {node_rank}: the store at {where} went away while the nodes were checking in ({exc}); node 0's "
                "launcher probably stopped (see its output). Nothing was started here."
            ) from None
    _check_claims(dup or ([node_rank] if claims > 1 else []), nnodes, where, hint)
    counts = {c for c, _ in sizes.values()}
    if len(counts) > 1:
        listing = ", ".join(f"node {r} ({h}): {c}" for r, (c, h) in sorted(sizes.items()))
        raise UsageError(
            f"the nodes of this job would run different numbers of ranks ({listing}); ddpboot needs the same number "
            "on every node (global rank = node rank × ranks per node + local rank). Give every node the same --nproc "
            "(e.g. the smallest count), or fix the GPUs the odd node sees (`ddpboot plan` on it shows why)."
        )
    if found:
        raise UsageError(
            f"the network check found that init_process_group would hang, so no worker was started: {'; '.join(found)}"
            ". (Set it where each node's launcher starts; NCCL_SOCKET_IFNAME takes name prefixes, eth for eth0 and "
            "eth1; a --hostfile job gives every host the NCCL_* and GLOO_* variables set where it starts. "
            "--no-network-check skips this check.)"
        )


def _store_name_note(master_addr: str) -> str | None:
    from ddpboot.nodes.netprobe import store_name_note

    return store_name_note(master_addr)


def _ticker(
    tick: Callable[[Callable[[], str]], None] | None,
) -> Callable[[Callable[[], str]], Callable[[], None] | None]:
    """The store client's tick for one wait: `tick` told what the wait is for (None without a tick)."""

    def bind(what: Callable[[], str]) -> Callable[[], None] | None:
        return None if tick is None else (lambda: tick(what))

    return bind


def _check_claims(dup: list[int], nnodes: int, where: str, hint: str) -> None:
    if dup:
        raise UsageError(
            f"two launchers claimed node rank {', '.join(map(str, dup))} of {nnodes} at {where}: each node needs a "
            f"node rank of its own, 0..{nnodes - 1}, and exactly one launcher: {hint}."
        )
