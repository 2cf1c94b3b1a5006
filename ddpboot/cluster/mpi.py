"""MPI launchers: ranks started by `mpirun` / `mpiexec` (Open MPI, MPICH and Intel MPI's Hydra, MVAPICH, Cray PALS).

Every MPI launcher gives each process its rank, the job's size, its node-local rank and the node's process count in
variables of its own (the `FLAVOURS` table, asked in order; the first whose four values are all present wins). A
launcher that gives fewer is not taken for MPI: `srun --mpi=pmi2` sets PMI_RANK and PMI_SIZE but no local rank, and
its SLURM variables describe the task fully. PMIx puts only PMIX_RANK and PMIX_NAMESPACE in the environment (the
sizes live in its server); the launchers that speak it give the sizes in their own variables (Open MPI's
OMPI_COMM_WORLD_*, srun's SLURM_*, jsrun's JSM_NAMESPACE_*), and PMIX_NAMESPACE names the job.

The store address, which no MPI variable gives (only rank 0 knows its host, and the ranks have no channel before
they meet; Lightning asks mpi4py, which needs MPI_Init in every rank):

- MASTER_ADDR when set (export it in the job script; Open MPI forwards it with `-x MASTER_ADDR`, Hydra forwards the
  whole environment); otherwise, when every rank runs on this host (local size == size), loopback; otherwise an
  error that says what to set.
- MASTER_PORT when set; otherwise a port derived from a value the launcher gives every rank of the job alike (Open
  MPI's job id, the PMIx namespace, PALS_APID); where it gives none (Hydra, MVAPICH), on one host, from the pid of
  the launcher's process on this node that started the ranks (hydra_pmi_proxy, mpispawn); on several hosts
  torchrun's default 29500.

Node rank and count: PALS_NODEID and Open MPI's node count where given. Otherwise, on one host, node 0 of 1; on
several, no variable says which node a rank is on (a hostfile without `:N` deals ranks round-robin, hosts may run
different numbers of ranks), so `ddpboot.init()` asks every rank's host once the process group exists
(cluster/placement.py); until then, and for `describe`, the estimate of mpirun's default placement (consecutive
ranks fill a node), rank // local size. The ranks meet by rank and address, so the node only informs
(`ctx.node_rank`, GROUP_RANK, GROUP_WORLD_SIZE).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ddpboot.cluster.base import (
    TaskEnvironment,
    check_below,
    first_set,
    job_port,
    job_port_of,
    parse_int,
    read_ranks,
    store_host,
    store_port,
)
from ddpboot.contract import TORCHRUN_MASTER_PORT
from ddpboot.errors import WorkerEnvError
from ddpboot.procfs import PROC, read_stat


class Flavour(NamedTuple):
    """The variables one MPI launcher gives each rank (first set of each tuple wins)."""

    name: str
    rank: tuple[str, ...]
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    job: tuple[str, ...] = ()  # the same on every rank of the job
    nnodes: tuple[str, ...] = ()
    node_rank: tuple[str, ...] = ()
    forward: str = "its mpiexec passes the environment on"  # how a variable reaches every rank

    def given(self, env: Mapping[str, str]) -> list[str]:
        """`NAME=VALUE` of this flavour's rank, size, local rank and local size variables in `env`."""
        found = [first_set(env, names) for names in (self.rank, self.size, self.local_rank, self.local_size)]
        return [f"{name}={value}" for name, value in filter(None, found)]

    def unset_fix(self, env: Mapping[str, str]) -> str:
        """What to do when no mpirun started the process: the variables were left in the shell."""
        names = " ".join(g.partition("=")[0] for g in self.given(env))
        return (f"If no mpirun or mpiexec started this process ({self.name}'s variables left in a shell), unset "
                f"them: unset {names}.")


FLAVOURS: tuple[Flavour, ...] = (
    Flavour("Open MPI", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_LOCAL_RANK",),
            ("OMPI_COMM_WORLD_LOCAL_SIZE",), job=("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"),
            nnodes=("OMPI_MCA_orte_num_nodes",), forward="Open MPI's mpirun forwards it with -x MASTER_ADDR"),
    Flavour("MVAPICH", ("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_SIZE",), ("MV2_COMM_WORLD_LOCAL_RANK",),
            ("MV2_COMM_WORLD_LOCAL_SIZE", "MPISPAWN_LOCAL_NPROCS"), job=("PMIX_NAMESPACE",),
            forward="mpirun_rsh passes the variables given on its command line (mpirun_rsh ... MASTER_ADDR=HOST ...)"),
    Flavour("Cray PALS", ("PALS_RANKID",), ("PMI_SIZE", "PALS_SIZE"), ("PALS_LOCAL_RANKID",),
            ("PMI_LOCAL_SIZE", "PALS_LOCAL_SIZE"), job=("PALS_APID",), node_rank=("PALS_NODEID",)),
    Flavour("MPICH/Intel MPI (Hydra)", ("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
            ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"), job=("PMIX_NAMESPACE",),
            forward="Hydra's mpiexec passes the environment on, or give it with mpiexec -genv MASTER_ADDR HOST"),
)

LAUNCHER_PROCESSES = frozenset({
    "hydra_pmi_proxy", "mpiexec.hydra", "mpiexec", "mpirun", "mpiexec.mpich", "mpirun.mpich", "mpirun.openmpi",
    "mpiexec.openmpi", "orted", "prted", "prterun", "mpispawn", "mpirun_rsh", "mpiexec.mpirun_r",
})
"""Command names (/proc/PID/comm, at most 15 characters) of the MPI processes that start ranks on a node."""


def mpi_flavour(env: Mapping[str, str]) -> Flavour | None:
    """The first flavour whose rank, size, local rank and local size variables are all set, or None."""
    for flavour in FLAVOURS:
        if all(first_set(env, names) for names in (flavour.rank, flavour.size, flavour.local_rank,
                                                   flavour.local_size)):
            return flavour
    return None


def launcher_pid(names: frozenset[str] = LAUNCHER_PROCESSES, proc: Path = PROC) -> int | None:
    """The pid of this process's nearest ancestor whose command is one of `names`, or None (no /proc, none found)."""
    pid = os.getppid()
    for _ in range(64):
        if pid <= 1:
            return None
        stat = read_stat(pid, proc)
        if stat is None:
            return None
        if stat.comm in names:
            return pid
        pid = stat.ppid
    return None


class MpiEnvironment(TaskEnvironment, name="mpi", local_rank_var="the MPI local rank", task_noun="MPI rank",
                     started_by="mpirun"):
    """One MPI rank per process (`mpirun -np 4 python train.py`): ranks from the MPI launcher's variables."""

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return mpi_flavour(env) is not None

    def __init__(self, env: Mapping[str, str]) -> None:
        flavour = mpi_flavour(env)
        if flavour is None:
            raise WorkerEnvError("no MPI launcher's rank variables are set (OMPI_COMM_WORLD_RANK, PMI_RANK, ...).")
        self.flavour = flavour
        context = f"{flavour.name}'s mpirun sets it for every rank it starts."
        self._rank, self._world_size, self._local_rank, self._local_world_size = read_ranks(
            env, flavour.rank, flavour.size, flavour.local_rank, flavour.local_size, context)
        self._nnodes, self._node_rank = self._nodes(env, flavour)
        one_host = self._local_world_size == self._world_size
        self._main_address = store_host(env, one_host, _address_fix(flavour, env))
        self._main_port = _store_port(env, flavour, one_host)

    def _nodes(self, env: Mapping[str, str], flavour: Flavour) -> tuple[int, int]:
        """(nnodes, node_rank): the launcher's own values where it gives them, else mpirun's default placement."""
        derived = -(-self._world_size // self._local_world_size)
        found = first_set(env, flavour.nnodes)
        nnodes = parse_int(found[0], found[1], minimum=1) if found else derived
        found = first_set(env, flavour.node_rank)
        node_rank = parse_int(*found) if found else min(self._rank // self._local_world_size, nnodes - 1)
        check_below(found[0] if found else "the MPI node index", node_rank, "the node count", nnodes)
        self._estimated = found is None and self._local_world_size < self._world_size
        return nnodes, node_rank

    @property
    def placed_by_hosts(self) -> bool:
        """No node index from the launcher and ranks on several hosts: init() asks where every rank runs."""
        return self._estimated

    def fewer_tasks(self, visible_count: int) -> str:
        return (f"start at most {visible_count} ranks per node (Open MPI: --map-by ppr:{visible_count}:node; "
                f"MPICH: -ppn {visible_count}).")

    def describe(self) -> str:
        return f"{super().describe()} ({self.flavour.name})"


def _address_fix(flavour: Flavour, env: Mapping[str, str]) -> str:
    return (f"{flavour.name}'s variables ({', '.join(flavour.given(env))}) do not say which host runs rank 0, where "
            "the rendezvous store listens. Fix: in the job script, before mpirun, export MASTER_ADDR=$(hostname) (the "
            f"host where rank 0 starts, the first of the host list) and MASTER_PORT={TORCHRUN_MASTER_PORT} "
            f"({flavour.forward}), or start one ddpboot launcher per node (`mpirun --map-by ppr:1:node ddpboot --nproc "
            f"N --master-addr HOST train.py`). {flavour.unset_fix(env)}")


def _store_port(env: Mapping[str, str], flavour: Flavour, one_host: bool) -> int:
    """MASTER_PORT; else derived from the job's id; else, on one host, from the node's MPI launcher process."""

    def derive() -> int | None:
        port = job_port_of(env, flavour.job)
        pid = launcher_pid() if port is None and one_host else None
        return port if pid is None else job_port(f"pid={pid}")

    return store_port(env, derive)
