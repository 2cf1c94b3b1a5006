"""Processes that ddpboot's own launcher started: the torchrun contract plus the variables ddpboot adds.

The launcher exports DDPBOOT_ISOLATION to every worker, so that variable is how such a process is recognised; it
also exports DDPBOOT_LOCAL_RANK (the true node-local index, read by `TorchrunEnvironment`) and DDPBOOT_GPU_UUIDS
(the GPUs it assigned to this rank). The names and the isolation modes are defined in `ddpboot.contract`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ddpboot.cluster.base import first_set
from ddpboot.cluster.torchrun import TorchrunEnvironment
from ddpboot.contract import GPU_UUIDS_VAR, ISOLATION_VAR, Isolation
from ddpboot.errors import WorkerEnvError


def split_uuids(value: str | None) -> tuple[str, ...]:
    """DDPBOOT_GPU_UUIDS (or a UUID CUDA_VISIBLE_DEVICES) as a tuple; empty for None or ''."""
    if not value:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


class DdpbootEnvironment(TorchrunEnvironment):
    """A worker of ddpboot's launcher: torchrun's ranks, plus its isolation mode and the GPUs assigned to it.

    Under rank isolation (the default) CUDA_VISIBLE_DEVICES names only this rank's GPUs, so LOCAL_RANK is exported
    as 0; under node isolation the worker sees the node's list and uses GPU number LOCAL_RANK, as under torchrun.
    """

    name: ClassVar[str] = "ddpboot"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return super().detect(env) and first_set(env, [ISOLATION_VAR]) is not None

    def __init__(self, env: Mapping[str, str]) -> None:
        super().__init__(env)
        found = first_set(env, [ISOLATION_VAR])
        try:
            self._isolation = Isolation.RANK if found is None else Isolation.parse(found[1], ISOLATION_VAR)
        except ValueError as exc:
            raise WorkerEnvError(f"{exc} Fix: let the ddpboot launcher set it.") from None
        self._assigned = split_uuids(env.get(GPU_UUIDS_VAR))

    @property
    def isolation(self) -> Isolation:
        """DDPBOOT_ISOLATION: each worker sees only its own GPUs (RANK) or all the node's (NODE, torchrun's)."""
        return self._isolation

    @property
    def assigned_gpus(self) -> tuple[str, ...]:
        """DDPBOOT_GPU_UUIDS: the GPUs the launcher assigned to this rank; empty for a CPU rank."""
        return self._assigned
