"""A hand-rolled env:// launch: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT only, no LOCAL_RANK/LOCAL_WORLD_SIZE.

What `init_process_group(init_method="env://")` needs is those four; launchers other than torchrun often give no
more: a Kubeflow PyTorchJob pod running the script without a launcher (one process per pod), a site's own
wrapper, a notebook driving workers by hand. Without a node-local index the only safe reading is one process per
node: local rank 0 of 1, node rank RANK of WORLD_SIZE nodes. `ddpboot.init()` says so once (`notes`), since where
several processes do share a machine they would all pick its first GPU.

With TORCHELASTIC_RUN_ID set the process claims to be torchrun's, which always sets LOCAL_RANK and
LOCAL_WORLD_SIZE; a missing one there stays an error (`TorchrunEnvironment`). So does a half pair (one of the two).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ddpboot.cluster.base import ClusterEnvironment, check_below, first_set, parse_port, read_int, require
from ddpboot.cluster.torchrun import ENV_INIT_VARS

_LOCAL_VARS = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
_CONTEXT = "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are what env:// needs; export all four for each process."


class EnvInitEnvironment(ClusterEnvironment):
    """RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and nothing else: one process per node."""

    name: ClassVar[str] = "env"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return (
            first_set(env, ["TORCHELASTIC_RUN_ID"]) is None
            and all(first_set(env, [var]) is not None for var in ENV_INIT_VARS)
            and all(first_set(env, [var]) is None for var in _LOCAL_VARS)
        )

    def __init__(self, env: Mapping[str, str]) -> None:
        _, self._world_size = read_int(env, "WORLD_SIZE", _CONTEXT, minimum=1)
        _, self._rank = read_int(env, "RANK", _CONTEXT)
        check_below("RANK", self._rank, "WORLD_SIZE", self._world_size)
        self._local_rank, self._local_world_size = 0, 1
        self._node_rank, self._nnodes = self._rank, self._world_size
        _, self._main_address = require(env, "MASTER_ADDR", _CONTEXT)
        self._main_port = parse_port(*require(env, "MASTER_PORT", _CONTEXT))

    @property
    def notes(self) -> tuple[str, ...]:
        return (
            f"RANK={self._rank}, WORLD_SIZE={self._world_size}, MASTER_ADDR and MASTER_PORT are set but LOCAL_RANK "
            "and LOCAL_WORLD_SIZE are not: ddpboot takes this process to be the only one of the job on its machine "
            "(local rank 0 of 1), so it uses the first GPU it sees. If several processes of the job share a "
            "machine, export LOCAL_RANK and LOCAL_WORLD_SIZE for each (or start them with ddpboot or torchrun).",
        )
