"""A process that no launcher started: a world of one, or a rank of a process group the script created itself.

Not part of `detect_environment`'s order: it is what the worker uses when no launcher is detected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ddpboot.cluster.base import ClusterEnvironment
from ddpboot.cluster.parallel import unknown_launch
from ddpboot.cluster.torchrun import ENV_INIT_VARS
from ddpboot.errors import WorkerEnvError


class LocalEnvironment(ClusterEnvironment):
    """No launcher. Built from the environment it is a world of one; `from_group` describes the ranks of a process
    group the script made itself (mp.spawn style, all on one node). There is no rendezvous store to name."""

    name: ClassVar[str] = "none"
    exports_contract: ClassVar[bool] = False
    joins_group: ClassVar[bool] = False

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """Always: this is the fallback when no launcher's environment is detected."""
        del env
        return True

    def __init__(self, env: Mapping[str, str]) -> None:
        _check_no_partial_contract(env)
        unknown = unknown_launch(env, "this process")
        if unknown is not None:
            raise WorkerEnvError(
                f"{unknown}. Fix: start the script with ddpboot or torchrun on each node, or export RANK, "
                "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each task; if no "
                "launcher started this process (the variables were left in the shell), unset them."
            )
        self._set(rank=0, world_size=1)

    @classmethod
    def from_group(cls, rank: int, world_size: int) -> LocalEnvironment:
        """The place of `rank` in an existing process group of `world_size` processes, all on this node."""
        self = cls.__new__(cls)
        self._set(rank, world_size)
        return self

    def _set(self, rank: int, world_size: int) -> None:
        self._rank, self._world_size = rank, world_size
        self._local_rank, self._local_world_size = rank, world_size
        self._node_rank, self._nnodes = 0, 1
        self._main_address, self._main_port = "", 0


def _check_no_partial_contract(env: Mapping[str, str]) -> None:
    """No launcher was detected, yet RANK/WORLD_SIZE say this is one rank of several: running on as a world of one
    would silently train N independent models, so name what is missing instead."""
    rank = env.get("RANK", "").strip()
    world = env.get("WORLD_SIZE", "").strip()
    if rank in ("", "0") and world in ("", "1"):
        return
    missing = [v for v in ENV_INIT_VARS if not env.get(v, "").strip()]
    raise WorkerEnvError(
        f"RANK={rank or '(unset)'} and WORLD_SIZE={world or '(unset)'} say this process is one rank of a job, but "
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so it cannot join the others. Fix: "
        "start the script with ddpboot or torchrun, or export all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
        "(or none of them, for a single process)."
    )
