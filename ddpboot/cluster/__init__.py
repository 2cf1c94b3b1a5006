"""Where a process's ranks, sizes and rendezvous address come from: one small class per launcher.

`detect_environment(env)` asks each environment in order and builds the first that recognises `env`. The
variables a launcher sets for the process itself come before those of a scheduler the process merely runs in
(workers of one launcher per node, started under srun or mpirun, inherit the launcher's SLURM_* or OMPI_*):

1. ddpboot's launcher (`DdpbootEnvironment`): the torchrun contract plus DDPBOOT_ISOLATION.
2. a hand-rolled env:// launch (`EnvInitEnvironment`): RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT without
   LOCAL_RANK/LOCAL_WORLD_SIZE or TORCHELASTIC_RUN_ID; one process per node, and init() says so.
3. torchrun (`TorchrunEnvironment`): TORCHELASTIC_RUN_ID is set, or all of RANK, WORLD_SIZE, MASTER_ADDR and
   MASTER_PORT are. Lightning and idr_torch decide "torchrun" by TORCHELASTIC_RUN_ID the same way.
4. jsrun under LSF (`JsrunEnvironment`): JSM_NAMESPACE_RANK / _SIZE, which only jsrun sets (it also sets
   Open MPI's variables, which say the same).
5. MPI (`MpiEnvironment`): the rank, size, local rank and local size of one of the launchers in
   `ddpboot.cluster.mpi.FLAVOURS` (Open MPI, MVAPICH, Cray PALS, MPICH/Intel MPI). Before SLURM: Open MPI's
   mpirun inside an allocation starts its node daemons with srun, so the ranks inherit a step's SLURM_PROCID that
   numbers the daemons, not them.
6. SLURM, one task per rank (`SlurmEnvironment`): a srun step (numeric SLURM_STEP_ID / SLURM_STEPID) with
   SLURM_PROCID set and more than one task (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS). The batch script of an
   sbatch job has SLURM_PROCID=0 and SLURM_NTASKS>1 but no step id, so it is not mistaken for rank 0.
7. pbsdsh under PBS (`PbsEnvironment`): PBS_VNODENUM with a task id above 1 (the batch script is task 1).
8. The environments other packages declare as entry points of the group `ddpboot.environments`, in the order of
   their names (`ddpboot.cluster.plugins`; read only when none of the above matched).
9. Otherwise None: a plain single process (the worker then uses `LocalEnvironment`).

`ddpboot.init(environment=...)` skips all of this for the environment the script names.

Everything here is a function of the mapping passed in (and of the files its variables name, such as
PBS_NODEFILE); only `detect_environment` defaults to os.environ. A detected environment whose variables are
missing or contradictory raises `ddpboot.errors.WorkerEnvError` naming the variable, rather than falling through
to the next source.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ddpboot.cluster.base import ClusterEnvironment
from ddpboot.cluster.ddpboot_launcher import DdpbootEnvironment, split_uuids
from ddpboot.cluster.env_init import EnvInitEnvironment
from ddpboot.cluster.hostlist import MAX_HOSTS, expand_hostlist, first_host
from ddpboot.cluster.local import LocalEnvironment
from ddpboot.cluster.lsf import JsrunEnvironment
from ddpboot.cluster.mpi import MpiEnvironment
from ddpboot.cluster.pbs import PbsEnvironment
from ddpboot.cluster.plugins import installed_plugins, plugin_failures
from ddpboot.cluster.slurm import (
    SlurmEnvironment,
    SlurmNodeInfo,
    derive_port,
    in_srun_step,
    parse_tasks_per_node,
    slurm_node_info,
)
from ddpboot.cluster.torchrun import TorchrunEnvironment

ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    DdpbootEnvironment,
    EnvInitEnvironment,
    TorchrunEnvironment,
    JsrunEnvironment,
    MpiEnvironment,
    SlurmEnvironment,
    PbsEnvironment,
)
"""The built-in detection order: the first whose `detect` is true wins; installed plugins come after."""


def detect_environment(
    env: Mapping[str, str] | None = None, plugins: Sequence[type[ClusterEnvironment]] | None = None
) -> ClusterEnvironment | None:
    """The environment that launched this process (see the module docstring for the order), or None.

    `plugins`: the environments asked after the built-in ones; None reads the installed entry points (once)."""
    if env is None:
        env = os.environ
    for cls in ENVIRONMENTS:
        if cls.detect(env):
            return cls(env)
    for cls in installed_plugins().environments if plugins is None else plugins:
        if cls.detect(env):
            return cls(env)
    return None


__all__ = [
    "ENVIRONMENTS",
    "MAX_HOSTS",
    "ClusterEnvironment",
    "DdpbootEnvironment",
    "EnvInitEnvironment",
    "JsrunEnvironment",
    "LocalEnvironment",
    "MpiEnvironment",
    "PbsEnvironment",
    "SlurmEnvironment",
    "SlurmNodeInfo",
    "TorchrunEnvironment",
    "derive_port",
    "detect_environment",
    "expand_hostlist",
    "first_host",
    "in_srun_step",
    "parse_tasks_per_node",
    "plugin_failures",
    "slurm_node_info",
    "split_uuids",
]
