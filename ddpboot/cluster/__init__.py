"""Where a process's ranks, sizes and rendezvous address come from: one small class per launcher.

`detect_environment(env)` asks each environment in order and builds the first that recognises `env`:

1. torchrun contract: TORCHELASTIC_RUN_ID is set, or all of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are.
   With DDPBOOT_ISOLATION set too, ddpboot's own launcher started the process (`DdpbootEnvironment`, which reads
   the variables it adds); otherwise torchrun or a hand-made env:// launch did (`TorchrunEnvironment`). This comes
   first because those workers often run inside a SLURM step too (one launcher per node under srun) and inherit
   SLURM_PROCID etc. that describe the launcher, not them; Lightning and idr_torch decide the same way, by
   TORCHELASTIC_RUN_ID.
2. SLURM, one task per rank (`SlurmEnvironment`): a srun step (numeric SLURM_STEP_ID / SLURM_STEPID) with
   SLURM_PROCID set and more than one task (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS). The batch script of an
   sbatch job has SLURM_PROCID=0 and SLURM_NTASKS>1 but no step id, so it is not mistaken for rank 0.
3. Otherwise None: a plain single process (the worker then uses `LocalEnvironment`).

Everything here is a pure function of the mapping passed in; only `detect_environment` defaults to os.environ.
A detected environment whose variables are missing or contradictory raises `ddpboot.errors.WorkerEnvError`
naming the variable, rather than falling through to the next source.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ddpboot.cluster.base import ClusterEnvironment
from ddpboot.cluster.ddpboot_launcher import DdpbootEnvironment, split_uuids
from ddpboot.cluster.hostlist import MAX_HOSTS, expand_hostlist, first_host
from ddpboot.cluster.local import LocalEnvironment
from ddpboot.cluster.slurm import (
    SlurmEnvironment,
    SlurmNodeInfo,
    derive_port,
    in_srun_step,
    parse_tasks_per_node,
    slurm_node_info,
)
from ddpboot.cluster.torchrun import TorchrunEnvironment

ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (DdpbootEnvironment, TorchrunEnvironment, SlurmEnvironment)
"""Detection order: the first whose `detect` is true wins."""


def detect_environment(env: Mapping[str, str] | None = None) -> ClusterEnvironment | None:
    """The environment that launched this process (see the module docstring for the order), or None."""
    if env is None:
        env = os.environ
    for cls in ENVIRONMENTS:
        if cls.detect(env):
            return cls(env)
    return None


__all__ = [
    "ENVIRONMENTS",
    "MAX_HOSTS",
    "ClusterEnvironment",
    "DdpbootEnvironment",
    "LocalEnvironment",
    "SlurmEnvironment",
    "SlurmNodeInfo",
    "TorchrunEnvironment",
    "derive_port",
    "detect_environment",
    "expand_hostlist",
    "first_host",
    "in_srun_step",
    "parse_tasks_per_node",
    "slurm_node_info",
    "split_uuids",
]
