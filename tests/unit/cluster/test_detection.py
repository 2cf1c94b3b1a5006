"""detect_environment: which launcher started this process, asked in a fixed order."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from ddpboot.cluster import (
    ENVIRONMENTS,
    DdpbootEnvironment,
    EnvInitEnvironment,
    JsrunEnvironment,
    MpiEnvironment,
    PbsEnvironment,
    SlurmEnvironment,
    TorchrunEnvironment,
    detect_environment,
)

TorchrunVars = Callable[..., dict[str, str]]


def test_plain_process_has_no_environment() -> None:
    assert detect_environment({}) is None
    assert detect_environment({"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}) is None


def test_the_order_puts_a_process_own_launcher_before_the_scheduler_it_runs_in() -> None:
    # ddpboot's workers also match torchrun's contract; a partial env:// contract must be seen before torchrun's
    # (which would call it incomplete); workers of a launcher under srun or mpirun inherit SLURM_* / OMPI_*, and
    # Open MPI's ranks inside an allocation inherit the SLURM step of its node daemons
    order = (DdpbootEnvironment, EnvInitEnvironment, TorchrunEnvironment, JsrunEnvironment, MpiEnvironment,
             SlurmEnvironment, PbsEnvironment)
    assert order == ENVIRONMENTS


def test_mpi_ranks_inside_a_srun_step_are_read_from_mpi(torchrun_vars: TorchrunVars) -> None:
    """Open MPI's mpirun in an allocation: its daemons are srun tasks (one per node), the ranks their children."""
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_STEP_NODELIST": "n[1-2]"}
    mpi = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "n1", "OMPI_MCA_ess_base_jobid": "99"}
    assert isinstance(detect_environment(step), SlurmEnvironment)
    env = detect_environment({**step, **mpi})
    assert isinstance(env, MpiEnvironment) and (env.global_rank, env.node_rank) == (6, 1)
    # and a ddpboot launcher's worker under mpirun is the launcher's, not MPI's
    worker = {**mpi, **torchrun_vars(), "DDPBOOT_ISOLATION": "rank"}
    assert isinstance(detect_environment(worker), DdpbootEnvironment)


def test_detect_environment_defaults_to_os_environ(
    monkeypatch: pytest.MonkeyPatch, torchrun_vars: TorchrunVars
) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_")) or name in torchrun_vars():
            monkeypatch.delenv(name)
    assert detect_environment() is None
    for name, value in torchrun_vars().items():
        monkeypatch.setenv(name, value)
    env = detect_environment()
    assert isinstance(env, TorchrunEnvironment)
    assert env.global_rank == 5
