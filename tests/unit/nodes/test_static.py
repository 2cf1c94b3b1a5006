"""Node count, node rank and store address: flags, SLURM (one launcher per node), or a single node
(ddpboot/nodes/static.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.cluster.base import job_port
from ddpboot.errors import UsageError, WorkerEnvError
from ddpboot.nodes.static import (
    check_resolvable,
    cluster_info,
    elastic_setup,
    parse_endpoint,
    parse_nnodes,
    parse_node_range,
    resolve_nodes,
)
from tests.support import srun_env

SRUN = srun_env(1, "gpu[07-08]")  # what srun gives a launcher on the second of two nodes with --ntasks-per-node=1


def test_single_node_by_default() -> None:
    s = resolve_nodes({})
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (1, 0, "127.0.0.1", None, "single")


def test_static_flags() -> None:
    s = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (2, 1, "10.0.0.1", 29500, "flags")


def test_slurm_one_launcher_per_node() -> None:
    s = resolve_nodes(SRUN)
    assert (s.nnodes, s.node_rank, s.master_addr, s.source) == (2, 1, "gpu07", "slurm")
    assert s.master_port == resolve_nodes(SRUN).master_port and 15000 <= (s.master_port or 0) < 32000
    assert s.notes == ()


def test_slurm_honours_master_port() -> None:
    assert resolve_nodes({**SRUN, "MASTER_PORT": "31337"}).master_port == 31337


def test_a_flag_that_contradicts_slurm_wins_with_a_note() -> None:
    s = resolve_nodes(SRUN, master_addr="gpu08")
    assert s.master_addr == "gpu08"
    assert any("--master-addr gpu08 overrides SLURM's gpu07" in n for n in s.notes)


def test_one_node_inside_slurm_stays_on_loopback() -> None:
    env = {**SRUN, "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
           "SLURM_STEP_NODELIST": "gpu07"}
    s = resolve_nodes(env)
    assert s.source == "single" and s.master_addr == "127.0.0.1" and s.master_port is None


def test_batch_script_is_not_a_step() -> None:
    env = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert resolve_nodes(env).source == "single"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, r"outside 0\.\.1"),
        ({"nnodes": 0}, "at least 1 node"),
        ({"nnodes": 2, "node_rank": 0}, "needs --master-addr"),
        ({"nnodes": 2, "master_addr": "h", "master_port": 70000}, "not a TCP port"),
    ],
)
def test_bad_input(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        resolve_nodes({}, **kwargs)  # type: ignore[arg-type]


def test_two_launchers_on_one_node_are_refused() -> None:
    with pytest.raises(UsageError, match="2 ddpboot launchers on this node"):
        resolve_nodes({**SRUN, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4",
                       "SLURM_NODEID": "0"})


def test_resolvable_and_not() -> None:
    assert check_resolvable("127.0.0.1") == "127.0.0.1"
    with pytest.raises(UsageError, match=r"(does|did) not resolve"):
        check_resolvable("no-such-host.invalid", timeout=5)


@pytest.mark.parametrize(
    ("text", "expected"), [("1", (1, 1)), (" 4 ", (4, 4)), ("2:2", (2, 2)), ("1:4", (1, 4)), ("3:8", (3, 8))]
)
def test_node_ranges(text: str, expected: tuple[int, int]) -> None:
    assert parse_node_range(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("3:2", r"MIN \(3\) is above MAX \(2\); write 2:3"),
        ("0:2", "at least 1 node"),
        ("0", "at least 1 node"),
        ("a:2", "is not a number of nodes"),
        ("1:", "is not a number of nodes"),
        ("1:2:3", "is not a number of nodes"),
        ("", "is not a number of nodes"),
    ],
)
def test_bad_node_ranges(text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_node_range(text)


def test_a_fixed_count_accepts_n_colon_n_and_points_ranges_to_the_launcher() -> None:
    assert parse_nnodes("3") == 3 and parse_nnodes("2:2") == 2
    with pytest.raises(UsageError, match=r"elastic range.*--dry-run --nnodes 1:2 --rdzv-backend c10d"):
        parse_nnodes("1:2")


def test_an_elastic_setup_is_planned_as_node_0_of_max() -> None:
    s = elastic_setup(1, 4, "10.0.0.1:29400", "10.0.0.2", ("a note",))
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (4, 0, "10.0.0.2", None, "elastic")
    assert "1 to 4 nodes through the c10d rendezvous at 10.0.0.1:29400" in s.describe()
    info = cluster_info(s)
    assert (info["min_nodes"], info["max_nodes"], info["rdzv_endpoint"], info["store_addr"]) == (
        1, 4, "10.0.0.1:29400", "10.0.0.2")
    assert info["notes"] == ["a note"] and "master_port" not in info


def test_endpoints() -> None:
    assert parse_endpoint("localhost:29400") == ("localhost", 29400)
    assert parse_endpoint("[::1]:5") == ("::1", 5)
    assert parse_endpoint("node1") == ("node1", None)
    assert parse_endpoint("node1:0") == ("node1", 0)  # no port: the caller's default
    with pytest.raises(UsageError, match="99999 is not a TCP port"):
        parse_endpoint("node1:99999")


# --- one launcher per node under MPI, jsrun and pbsdsh ------------------------------------------------------------

MPIRUN = {  # launcher 1 of `mpirun --map-by ppr:1:node -np 2 ddpboot ...` (Open MPI), on the second host
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": "77",
}


def test_mpi_one_launcher_per_node() -> None:
    with pytest.raises(UsageError, match=r"MPI rank 1 of 2, on several hosts.*Pass --master-addr HOST"):
        resolve_nodes(MPIRUN)
    s = resolve_nodes({**MPIRUN, "MASTER_ADDR": "gpu07"})
    assert (s.nnodes, s.node_rank, s.master_addr, s.source) == (2, 1, "gpu07", "mpi")
    assert s.master_port == job_port("OMPI_MCA_ess_base_jobid=77") and s.notes == ()
    flagged = resolve_nodes(MPIRUN, master_addr="10.0.0.7", master_port=4000)
    assert (flagged.master_addr, flagged.master_port, flagged.source) == ("10.0.0.7", 4000, "mpi")
    assert "overrides" not in " ".join(flagged.notes)  # the flags named what MPI does not


def test_mpi_launchers_sharing_a_host_are_nodes_of_their_own() -> None:
    env = {**MPIRUN, "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    s = resolve_nodes(env)
    assert (s.nnodes, s.node_rank, s.master_addr, s.source) == (2, 1, "127.0.0.1", "mpi")
    [note] = s.notes
    assert "MPI started 2 ddpboot launchers on this host" in note
    assert resolve_nodes(env, nnodes=1).source == "single"  # --nnodes 1 keeps one node


def test_jsrun_one_launcher_per_node() -> None:
    env = {"JSM_NAMESPACE_RANK": "2", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_LOCAL_RANK": "0",
           "JSM_NAMESPACE_LOCAL_SIZE": "1", "LSB_JOBID": "9", "MASTER_ADDR": "a01n01"}
    s = resolve_nodes(env)
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (
        4, 2, "a01n01", job_port("LSB_JOBID=9"), "lsf")


def test_pbsdsh_one_launcher_per_host(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n07\nn07\nn12\nn12\n")
    env = {"PBS_JOBID": "55.pbs", "PBS_NODEFILE": str(nodefile), "PBS_VNODENUM": "2", "PBS_TASKNUM": "3",
           "PBS_NODENUM": "1"}
    s = resolve_nodes(env)
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (
        2, 1, "n07", job_port("PBS_JOBID=55.pbs"), "pbs")
    # the batch script (task 1) is one node, as any shell
    assert resolve_nodes({**env, "PBS_TASKNUM": "1"}).source == "single"
    s = resolve_nodes(env, node_rank=0)
    assert s.source == "pbs" and any("--node-rank 0 overrides PBS's 1 (from PBS_NODENUM)" in n for n in s.notes)
    assert s.port_from == "derived from PBS_JOBID and the command of this step"
    assert resolve_nodes(env, step="x").master_port == job_port("PBS_JOBID=55.pbs x")  # each step its own port
    assert resolve_nodes({**env, "MASTER_PORT": "29600"}).port_from == ""


def test_pbsdsh_on_a_sister_host_takes_the_nodes_from_the_flags() -> None:
    """Torque gives a task on a host other than the first no PBS_NODEFILE: --nnodes and --master-addr stand in."""
    env = {"PBS_JOBID": "55.pbs", "PBS_VNODENUM": "2", "PBS_TASKNUM": "4", "PBS_NODENUM": "1", "PBS_NUM_NODES": "2"}
    s = resolve_nodes(env, nnodes=2, master_addr="n07")
    assert (s.nnodes, s.node_rank, s.master_addr, s.master_port, s.source) == (
        2, 1, "n07", job_port("PBS_JOBID=55.pbs"), "pbs")
    with pytest.raises(WorkerEnvError, match=r"has no PBS_NODEFILE, and --nnodes is not given"):
        resolve_nodes(env, master_addr="n07")
