"""The node setup a launcher runs with, from its node options given explicitly (None: not given)."""

from __future__ import annotations

import re
import socket

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.launcher import (
    NodeOptions,
    StoreAddress,
    bind_node_store,
    job_run_id,
    launcher_nodes,
    store_address,
)
from ddpboot.nodes.static import resolve_nodes
from tests.support import srun_env

SRUN = srun_env(1, "localhost")  # the launcher on the second of two nodes, started by srun with --ntasks-per-node=1


def test_no_option_is_one_node() -> None:
    nodes = launcher_nodes(NodeOptions(), {})
    assert (nodes.nnodes, nodes.node_rank, nodes.source) == (1, 0, "single")


def test_options_not_given_leave_the_choice_to_slurm() -> None:
    nodes = launcher_nodes(NodeOptions(), SRUN)
    assert (nodes.nnodes, nodes.node_rank, nodes.source) == (2, 1, "slurm")
    given = launcher_nodes(NodeOptions(node_rank=0), SRUN)  # an explicit node rank wins, with a note
    assert given.node_rank == 0 and any("--node-rank 0 overrides SLURM's 1" in n for n in given.notes)


def test_a_fixed_count_takes_the_store_port_from_the_rendezvous_endpoint() -> None:
    options = NodeOptions(nnodes="2", node_rank=1, master_addr="127.0.0.1", rdzv_endpoint="localhost:29555")
    nodes = launcher_nodes(options, {})
    assert (nodes.nnodes, nodes.node_rank, nodes.master_addr, nodes.master_port) == (2, 1, "127.0.0.1", 29555)
    assert launcher_nodes(NodeOptions(nnodes="2:2", node_rank=1, master_addr="127.0.0.1"), {}).nnodes == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (NodeOptions(nnodes="2", node_rank=1, master_addr="no-such-host.invalid"), "not resolve"),
        (NodeOptions(nnodes="2", master_addr="127.0.0.1", node_rank=3), r"outside 0\.\.1"),
        (NodeOptions(nnodes="2", standalone=True), "--nnodes 2 with --standalone, a one-node job"),
        (NodeOptions(nnodes="2:2", standalone=True), "--nnodes 2 with --standalone"),
        (NodeOptions(nnodes="1:2", standalone=True), "--standalone is a one-node job and --nnodes 1:2"),
        (NodeOptions(nnodes="1:2"), "--rdzv-backend is static and --rdzv-endpoint is missing"),
        (NodeOptions(nnodes="3:2"), r"MIN \(3\) is above MAX \(2\)"),
    ],
)
def test_bad_node_options(options: NodeOptions, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        launcher_nodes(options, {})


def test_a_fixed_count_through_c10d_is_numbered_by_the_rendezvous() -> None:
    # torchrun's `--nnodes 4 --rdzv-backend c10d --rdzv-endpoint H:P`: every node the same command, no node rank
    for count in ("4", "4:4"):
        nodes = launcher_nodes(NodeOptions(nnodes=count, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29555"), {})
        assert (nodes.source, nodes.min_nodes, nodes.max_nodes, nodes.rdzv_endpoint) == (
            "elastic", 4, 4, "127.0.0.1:29555")
    # with a node rank (a Kubernetes Indexed Job's line) too: torchrun ignores --node-rank there, and says so
    given = launcher_nodes(NodeOptions(nnodes="4", node_rank=2, rdzv_backend="c10d",
                                       rdzv_endpoint="127.0.0.1:29555"), {})
    assert (given.source, given.max_nodes, given.rdzv_endpoint) == ("elastic", 4, "127.0.0.1:29555")
    assert any(n.startswith("--node-rank not used through the c10d rendezvous") for n in given.notes)
    # inside a SLURM step, which numbers the nodes, the endpoint is node 0's store address
    slurm = launcher_nodes(NodeOptions(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29556"), SRUN)
    assert (slurm.source, slurm.node_rank, slurm.master_addr, slurm.master_port) == ("slurm", 1, "127.0.0.1", 29556)


def test_the_static_endpoint_line_names_node_0_without_master_addr() -> None:
    # torchrun's static rendezvous: `--nnodes 2 --node-rank 1 --rdzv-endpoint H:P` is --master-addr H --master-port P
    nodes = launcher_nodes(NodeOptions(nnodes="2", node_rank=1, rdzv_endpoint="127.0.0.1:29411"), {})
    assert (nodes.source, nodes.node_rank, nodes.master_addr, nodes.master_port) == ("flags", 1, "127.0.0.1", 29411)
    assert nodes.master_addr_option == "--rdzv-endpoint"
    assert launcher_nodes(NodeOptions(nnodes="2", node_rank=1, rdzv_endpoint="127.0.0.1"), {}).master_port == 29500
    flags = launcher_nodes(NodeOptions(nnodes="2", node_rank=0, master_addr="localhost", master_port=29600,
                                       rdzv_endpoint="127.0.0.1:29411"), {})
    assert (flags.master_addr, flags.master_port, flags.master_addr_option) == ("localhost", 29600, "--master-addr")
    with pytest.raises(UsageError, match=r"--rdzv-endpoint no-such-host\.invalid does not resolve"):
        launcher_nodes(NodeOptions(nnodes="2", node_rank=1, rdzv_endpoint="no-such-host.invalid:29411"), {})


def test_several_nodes_cannot_restart_yet() -> None:
    with pytest.raises(UsageError, match="--max-restarts 2 with 2 nodes"):
        launcher_nodes(NodeOptions(nnodes="2", node_rank=1, master_addr="127.0.0.1"), {}, max_restarts=2)


def test_standalone_is_one_node_whatever_else_is_said() -> None:
    nodes = launcher_nodes(NodeOptions(nnodes="1:1", node_rank=3, standalone=True), {})
    assert nodes == resolve_nodes({})
    with pytest.raises(UsageError, match=r"^--standalone, but this srun step spans 2 nodes: each would run a job "
                       r"of its own\. Drop --standalone: ddpboot then takes the nodes from the step \(SLURM_STEP"):
        launcher_nodes(NodeOptions(standalone=True), SRUN)
    # `mpirun -np 2 ddpboot --standalone ...` (or `--nnodes 1`) would run two unrelated one-node jobs
    mpirun = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    for given in (NodeOptions(standalone=True), NodeOptions(nnodes="1"), NodeOptions(nnodes="1:1")):
        flag = "--standalone" if given.standalone else f"--nnodes {given.nnodes}"
        with pytest.raises(UsageError, match=rf"^{flag}, but MPI started 2 ddpboot launchers: each would run a job "
                           rf"of its own\. Drop {flag.split()[0]}: .*OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_RANK.*"
                           r"mpirun -np 1"):
            launcher_nodes(given, mpirun)
    alone = {**mpirun, "OMPI_COMM_WORLD_SIZE": "1"}
    assert launcher_nodes(NodeOptions(standalone=True), alone) == resolve_nodes({})
    assert launcher_nodes(NodeOptions(nnodes="1"), alone).nnodes == 1


@pytest.mark.parametrize(
    ("env", "signs"),
    [
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "PMI_SIZE=2, PMI_RANK=1"),  # Flux-like: PMI without a local rank
        ({"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-x-1@1"}, "PMIX_RANK=1"),  # PMIx only
        ({"PBS_JOBID": "7.pbs", "PBS_TASKNUM": "00000002", "PBS_NODENUM": "1"}, "PBS_TASKNUM=00000002"),  # OpenPBS
        ({"LSB_JOBID": "42", "LSF_PM_TASKID": "2"}, "LSF_PM_TASKID=2"),  # blaunch
    ],
)
def test_a_parallel_launch_ddpboot_cannot_read_is_refused(env: dict[str, str], signs: str) -> None:
    for options in (NodeOptions(), NodeOptions(standalone=True), NodeOptions(nnodes="1")):
        with pytest.raises(UsageError, match=rf"{re.escape(signs)} say this ddpboot launcher is one of several tasks "
                           r".*world of one.*--nnodes N --node-rank R --master-addr HOST.*unset them"):
            launcher_nodes(options, env)
    # given the nodes explicitly, it runs as told
    nodes = launcher_nodes(NodeOptions(nnodes="2", node_rank=1, master_addr="127.0.0.1"), env)
    assert (nodes.nnodes, nodes.node_rank, nodes.source) == (2, 1, "flags")


def test_an_elastic_range_notes_the_options_it_does_not_use() -> None:
    options = NodeOptions(nnodes="1:2", node_rank=1, master_port=5, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:29411")
    nodes = launcher_nodes(options, {})
    assert (nodes.source, nodes.min_nodes, nodes.max_nodes, nodes.rdzv_endpoint) == (
        "elastic", 1, 2, "127.0.0.1:29411")
    assert any(n.startswith("--node-rank, --master-port not used through the c10d rendezvous") for n in nodes.notes)
    with pytest.raises(UsageError, match="--ranks-filter names global ranks"):
        launcher_nodes(options, {}, ranks_filter="0")


def test_one_node_store_address() -> None:
    one = resolve_nodes({})
    assert store_address(one, NodeOptions()) == StoreAddress("127.0.0.1", "127.0.0.1", None)
    assert store_address(one, NodeOptions(master_addr="localhost", master_port=29588)) == StoreAddress(
        "127.0.0.1", "127.0.0.1", 29588)
    assert store_address(one, NodeOptions(rdzv_endpoint="localhost:29577")).port == 29577
    assert store_address(one, NodeOptions(rdzv_endpoint="localhost:0")).port is None
    with pytest.raises(UsageError, match="--master-port 70000 is not a TCP port"):
        store_address(one, NodeOptions(master_port=70000))
    with pytest.raises(UsageError, match="is another host, and a one-node job serves its store here"):
        store_address(one, NodeOptions(rdzv_endpoint="otherhost.example:29500"))


def test_several_nodes_store_address_is_node_0s() -> None:
    nodes = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29511)
    assert store_address(nodes, NodeOptions()) == StoreAddress("10.0.0.1", "10.0.0.1", 29511)


def test_only_node_0_binds_the_store_address() -> None:
    one = resolve_nodes({})
    with bind_node_store(one, StoreAddress("127.0.0.1", "127.0.0.1", None)) as sock:
        port = sock.getsockname()[1]
        with pytest.raises(UsageError):
            bind_node_store(one, StoreAddress("127.0.0.1", "127.0.0.1", port)).close()  # in use
        other = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=port)
        with bind_node_store(other, StoreAddress("127.0.0.1", "127.0.0.1", port)) as private:
            assert private.getsockname()[1] != port
    first = resolve_nodes({}, nnodes=2, node_rank=0, master_addr="10.99.99.99", master_port=29512)
    with pytest.raises(UsageError, match="this is node 0 \\(--node-rank 0\\)"):
        bind_node_store(first, StoreAddress("10.99.99.99", "10.99.99.99", 29512))


def test_node_0_binds_a_listener_group_when_asked_and_other_nodes_one_private_socket() -> None:
    from ddpboot.tcpstore.address import listening_sockets

    one = resolve_nodes({})
    with bind_node_store(one, StoreAddress("127.0.0.1", "127.0.0.1", None), listeners=3) as group:
        assert len(listening_sockets(group)) == 3
        port = group.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is in use"):
            bind_node_store(one, StoreAddress("127.0.0.1", "127.0.0.1", port), listeners=3).close()
        other = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=port)
        with bind_node_store(other, StoreAddress("127.0.0.1", "127.0.0.1", port), listeners=3) as private:
            assert len(listening_sockets(private)) == 1 and private.getsockname()[1] != port


def test_run_ids_agree_across_nodes_without_talking() -> None:
    nodes = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29511)
    assert job_run_id(None, nodes, {}) == "nodes-10.0.0.1-29511"
    slurm = resolve_nodes(SRUN)
    assert job_run_id("none", slurm, SRUN) == "slurm-4242.0"  # torchrun's default id is no id
    assert job_run_id("job7", slurm, SRUN) == "job7"
    fresh = {job_run_id(None, resolve_nodes({}), {}) for _ in range(3)}
    assert len(fresh) == 3 and all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", r) for r in fresh)


def test_hostname_counts_as_this_machine() -> None:
    one = resolve_nodes({})
    assert store_address(one, NodeOptions(rdzv_endpoint=f"{socket.gethostname()}:29578")).port == 29578
