"""MpiEnvironment: each MPI launcher's variables (as measured under Open MPI 4.1 and MPICH 4.0's Hydra on Debian 12,
and as documented for MVAPICH and Cray PALS), the store address and port, and their errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpboot.cluster import MpiEnvironment, detect_environment
from ddpboot.cluster.base import job_port
from ddpboot.cluster.mpi import launcher_pid
from ddpboot.contract import TORCHRUN_MASTER_PORT
from ddpboot.errors import WorkerEnvError

Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]

OPEN_MPI = {  # rank 1 of `mpirun -np 2` on one host (Open MPI 4.1.4)
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_MCA_ess_base_jobid": "1309736961",
    "OMPI_MCA_orte_num_nodes": "1", "PMIX_RANK": "1", "PMIX_NAMESPACE": "1309736961",
}
HYDRA = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4", "PMI_FD": "6"}
MVAPICH = {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
           "MV2_COMM_WORLD_LOCAL_SIZE": "2"}
PALS = {"PALS_RANKID": "13", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "3", "PALS_APID": "8762756694016",
        "PMI_RANK": "13", "PMI_SIZE": "16", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4"}


def test_open_mpi_on_one_host(layout: Layout) -> None:
    env = detect_environment(OPEN_MPI)
    assert isinstance(env, MpiEnvironment) and env.flavour.name == "Open MPI"
    assert layout(env) == (1, 2, 1, 2, 0, 1, "127.0.0.1", job_port("OMPI_MCA_ess_base_jobid=1309736961"))
    assert env.name == "mpi" and env.exports_contract and env.narrows_visible_devices and "Open MPI" in env.describe()


def test_mpich_hydra_on_several_hosts_needs_master_addr(layout: Layout) -> None:
    with pytest.raises(WorkerEnvError, match=r"MASTER_ADDR is not set.*several hosts.*export MASTER_ADDR=\$\(hostname"):
        MpiEnvironment(HYDRA)
    env = MpiEnvironment({**HYDRA, "MASTER_ADDR": "n1"})
    # no job id in Hydra's variables: torchrun's default port across hosts
    assert layout(env) == (5, 8, 1, 4, 1, 2, "n1", TORCHRUN_MASTER_PORT)
    assert MpiEnvironment({**HYDRA, "MASTER_ADDR": "n1", "MASTER_PORT": "4321"}).main_port == 4321


def test_the_error_names_the_variables_and_how_each_launcher_forwards_master_addr() -> None:
    """Variables left in a shell look like a rank of mpirun: the message says which, and to unset them; Hydra's
    advice is Hydra's (it passes the environment on), not Open MPI's -x."""
    with pytest.raises(WorkerEnvError, match=r"\(PMI_RANK=5, PMI_SIZE=8, MPI_LOCALRANKID=1, MPI_LOCALNRANKS=4\).*"
                       r"Hydra's mpiexec passes the environment on, or give it with mpiexec -genv MASTER_ADDR HOST.*"
                       r"unset them: unset PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS\.$") as hydra:
        MpiEnvironment(HYDRA)
    assert "-x" not in str(hydra.value)
    several = {**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "4"}
    with pytest.raises(WorkerEnvError, match=r"OMPI_COMM_WORLD_SIZE=4.*Open MPI's mpirun forwards it with -x "
                       r"MASTER_ADDR.*unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE"):
        MpiEnvironment(several)


def test_the_node_is_found_from_the_hosts_unless_the_launcher_gives_it() -> None:
    """rank // local size is only mpirun's default placement: on several hosts init() asks where the ranks run."""
    assert MpiEnvironment({**HYDRA, "MASTER_ADDR": "n1"}).placed_by_hosts
    assert not MpiEnvironment(OPEN_MPI).placed_by_hosts  # every rank on this host: node 0 of 1
    assert not MpiEnvironment({**PALS, "MASTER_ADDR": "x"}).placed_by_hosts  # PALS_NODEID says it
    env = MpiEnvironment({**HYDRA, "MASTER_ADDR": "n1"})
    env.place(0, 2)
    assert (env.node_rank, env.nnodes) == (0, 2)


def test_mvapich_and_cray_pals(layout: Layout) -> None:
    env = MpiEnvironment({**MVAPICH, "MASTER_ADDR": "a", "MASTER_PORT": "2000"})
    assert env.flavour.name == "MVAPICH" and layout(env) == (3, 4, 1, 2, 1, 2, "a", 2000)
    pals = MpiEnvironment({**PALS, "MASTER_ADDR": "x1000c0s0b0n0"})
    assert pals.flavour.name == "Cray PALS"  # asked before Hydra's PMI_*, which Cray PMI sets too
    assert layout(pals) == (13, 16, 1, 4, 3, 4, "x1000c0s0b0n0", job_port("PALS_APID=8762756694016"))


def test_one_host_without_a_job_id_derives_the_port_from_the_node_s_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    one_host = {**HYDRA, "PMI_RANK": "1", "PMI_SIZE": "4"}
    monkeypatch.setattr("ddpboot.cluster.mpi.launcher_pid", lambda: 4242)
    assert MpiEnvironment(one_host).main_port == job_port("pid=4242")
    monkeypatch.setattr("ddpboot.cluster.mpi.launcher_pid", lambda: None)
    assert MpiEnvironment(one_host).main_port == TORCHRUN_MASTER_PORT


def test_launcher_pid_walks_up_to_the_mpi_process(tmp_path: Path) -> None:
    me, parent = os.getpid(), os.getppid()
    assert launcher_pid(frozenset({"no-such-launcher"})) is None
    proc = Path("/proc") / str(parent) / "comm"
    assert launcher_pid(frozenset({proc.read_text().strip()})) == parent
    assert me != parent


def test_an_incomplete_mpi_set_is_not_mpi() -> None:
    # srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE only; its SLURM_* describe the task
    assert not MpiEnvironment.detect({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert not MpiEnvironment.detect({"PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.7.0"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"OMPI_COMM_WORLD_RANK": "2"}, "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "OMPI_COMM_WORLD_LOCAL_SIZE=3 is larger than OMPI_COMM_WORLD_SIZE=2"),
        ({"OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "OMPI_COMM_WORLD_LOCAL_RANK='x'"),
        ({"OMPI_MCA_orte_num_nodes": "0"}, "OMPI_MCA_orte_num_nodes='0'"),
        ({"MASTER_PORT": "99999"}, "MASTER_PORT='99999' is not a TCP port"),
    ],
)
def test_bad_values_name_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(WorkerEnvError, match=message):
        MpiEnvironment({**OPEN_MPI, **change})


def test_each_rank_of_a_node_takes_its_own_gpu() -> None:
    env = MpiEnvironment({**HYDRA, "MASTER_ADDR": "n1"})  # local rank 1 of 4
    assert env.own_visible_devices(["GPU-a", "GPU-b", "GPU-c", "GPU-d"], 4) == "GPU-b"
    assert env.own_visible_devices(None, 8) == "1"
    assert env.own_visible_devices(["GPU-a"], 1) is None  # a wrapper gave each rank its GPU already
    with pytest.raises(WorkerEnvError, match="mpirun started 4 tasks on this node but this task sees 2 GPUs"):
        env.own_visible_devices(["0", "1"], 2)
