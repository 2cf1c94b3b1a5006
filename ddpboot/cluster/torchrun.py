"""Processes started with the torchrun contract: by torchrun itself, by ddpboot's launcher, or by hand.

torchrun gives every worker RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID (torch.distributed.run's documented worker environment);
ddpboot's launcher gives the same set (`ddpboot.cluster.ddpboot_launcher` reads what it adds).

LOCAL_RANK says which visible GPU is the worker's (`device_index`); `local_rank` is the true node-local index, which
differs under ddpboot's rank isolation: there each worker sees only its own GPU, LOCAL_RANK is exported as 0 (scripts
calling `set_device(LOCAL_RANK)` then pick that GPU) and the true index is in DDPBOOT_LOCAL_RANK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ddpboot.cluster.base import (
    ClusterEnvironment,
    check_at_most,
    check_below,
    first_set,
    parse_int,
    parse_port,
    read_int,
    require,
)
from ddpboot.contract import LOCAL_RANK_VAR
from ddpboot.errors import WorkerEnvError

# Together these are what `init_process_group(init_method="env://")` needs; all four set means someone meant to
# start this process as one rank of a job, even without torchrun's TORCHELASTIC_RUN_ID.
ENV_INIT_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_CONTEXT = (
    "This process looks torchrun-launched (TORCHELASTIC_RUN_ID is set, or RANK, WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT are). torchrun and ddpboot set RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT for every worker; if you start processes yourself, export the missing ones too, or unset "
    "TORCHELASTIC_RUN_ID/RANK/WORLD_SIZE to run as a single process."
)


class TorchrunEnvironment(ClusterEnvironment):
    """Ranks and the store address from torchrun's variables (also what ddpboot's launcher exports).

    GROUP_RANK / GROUP_WORLD_SIZE (node rank, node count) are optional: launchers other than torchrun often omit
    them. When absent they are derived from torchrun's layout, consecutive ranks on equal-sized nodes:
    node_rank = RANK // LOCAL_WORLD_SIZE, nnodes = WORLD_SIZE // LOCAL_WORLD_SIZE.
    """

    name: ClassVar[str] = "torchrun"
    exports_contract: ClassVar[bool] = False

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return first_set(env, ["TORCHELASTIC_RUN_ID"]) is not None or all(
            first_set(env, [var]) is not None for var in ENV_INIT_VARS
        )

    def __init__(self, env: Mapping[str, str]) -> None:
        _, self._world_size = read_int(env, "WORLD_SIZE", _CONTEXT, minimum=1)
        _, self._rank = read_int(env, "RANK", _CONTEXT)
        check_below("RANK", self._rank, "WORLD_SIZE", self._world_size)

        _, self._local_world_size = read_int(env, "LOCAL_WORLD_SIZE", _CONTEXT, minimum=1)
        check_at_most("LOCAL_WORLD_SIZE", self._local_world_size, "WORLD_SIZE", self._world_size)
        _, self._exported_local_rank = read_int(env, "LOCAL_RANK", _CONTEXT)
        check_below("LOCAL_RANK", self._exported_local_rank, "LOCAL_WORLD_SIZE", self._local_world_size)
        true_local = first_set(env, [LOCAL_RANK_VAR])
        if true_local is None:
            self._local_rank = self._exported_local_rank
        else:
            self._local_rank = parse_int(LOCAL_RANK_VAR, true_local[1])
            check_below(LOCAL_RANK_VAR, self._local_rank, "LOCAL_WORLD_SIZE", self._local_world_size)

        self._nnodes, self._node_rank = self._read_nodes(env)

        _, self._main_address = require(env, "MASTER_ADDR", _CONTEXT)
        port_var, port_raw = require(env, "MASTER_PORT", _CONTEXT)
        self._main_port = parse_port(port_var, port_raw)

    def _read_nodes(self, env: Mapping[str, str]) -> tuple[int, int]:
        """(nnodes, node_rank) from GROUP_WORLD_SIZE / GROUP_RANK, or derived from torchrun's layout."""
        group_size = first_set(env, ["GROUP_WORLD_SIZE"])
        group_rank = first_set(env, ["GROUP_RANK"])
        if group_size is not None:
            nnodes = parse_int("GROUP_WORLD_SIZE", group_size[1], minimum=1)
            check_at_most("GROUP_WORLD_SIZE", nnodes, "WORLD_SIZE", self._world_size)
        elif self._world_size % self._local_world_size == 0:
            nnodes = self._world_size // self._local_world_size
        else:
            raise WorkerEnvError(
                f"GROUP_WORLD_SIZE is not set and cannot be derived: WORLD_SIZE={self._world_size} is not a "
                f"multiple of LOCAL_WORLD_SIZE={self._local_world_size}, so nodes run different numbers of "
                "processes. Export GROUP_WORLD_SIZE (number of nodes) and GROUP_RANK (this node's index)."
            )
        if group_rank is not None:
            node_rank = parse_int("GROUP_RANK", group_rank[1])
        else:
            node_rank = self._rank // self._local_world_size
        check_below(
            "GROUP_RANK" if group_rank is not None else "RANK // LOCAL_WORLD_SIZE",
            node_rank,
            "GROUP_WORLD_SIZE" if group_size is not None else "WORLD_SIZE // LOCAL_WORLD_SIZE",
            nnodes,
        )
        return nnodes, node_rank

    @property
    def device_index(self) -> int:
        """LOCAL_RANK as exported: the index of this worker's GPU among those it sees."""
        return self._exported_local_rank
