"""Node ranks from where the ranks really run, for launchers whose variables give a rank's node-local place but not
its node: MPI (every flavour but Cray PALS) and jsrun give the local rank and the node's process count, and the node
used to be derived from the default placement (rank // local size). That is wrong for any other placement: a Hydra
hostfile without `:N` deals ranks round-robin (ranks 0 and 2 on one host, 1 and 3 on the other), `--map-by node`
and jsrun's cyclic placement do the same, and uneven hosts (2 + 1 ranks) give node counts that differ per rank.

So `ddpboot.init()` asks, once the process group exists, where every rank runs (`host_identity`: the host name and
the kernel's boot id, which two machines never share even where their names agree) and numbers the nodes by their
lowest rank (`place`): the host of rank 0 is node 0, the host of the lowest rank not on it node 1, and so on. The
launcher's own local ranks and sizes must agree with that grouping; where they do not (two processes on one host
that MPI counts as two nodes, or the reverse), nothing can say which is right and init() stops with one message.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import NamedTuple

from ddpboot.errors import WorkerEnvError

BOOT_ID = "/proc/sys/kernel/random/boot_id"


class Where(NamedTuple):
    """What one rank says about its place: its host and the launcher's local rank and size for it."""

    host: str
    local_rank: int
    local_size: int


class Placement(NamedTuple):
    node_rank: int
    nnodes: int


def host_identity(boot_id: str = BOOT_ID) -> str:
    """This machine as the ranks compare it: `NAME BOOT_ID` (the name alone where the boot id cannot be read)."""
    try:
        with open(boot_id, encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()} {boot}".strip()


def place(ranks: Sequence[Where], rank: int, launcher: str) -> Placement:
    """Node rank and node count of `rank`, when rank r says `ranks[r]`: the hosts numbered by their lowest rank.
    WorkerEnvError naming the ranks where the launcher's local ranks and sizes contradict the hosts."""
    nodes: dict[str, list[int]] = {}
    for r, where in enumerate(ranks):
        nodes.setdefault(where.host, []).append(r)
    problems = []
    for host, members in nodes.items():
        for local, r in enumerate(members):
            said = ranks[r]
            if (said.local_rank, said.local_size) != (local, len(members)):
                problems.append(f"rank {r} on {host.split(' ')[0]} is local rank {said.local_rank} of "
                                f"{said.local_size} for {launcher}, but rank {local} of the {len(members)} ranks "
                                f"there ({', '.join(map(str, members))})")
    if problems:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise WorkerEnvError(
            f"the ranks' hosts contradict {launcher}'s local ranks ({shown}), so this rank's node is unknown. "
            "Fix: give each host its own name (the processes of one machine must share it, and two machines "
            "must not), or start the ranks with one ddpboot launcher per node."
        )
    order = list(nodes)  # dicts keep insertion order: by each host's lowest rank
    return Placement(order.index(ranks[rank].host), len(order))
