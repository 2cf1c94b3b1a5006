"""Cluster environments: which launcher started this process, and the ranks it gave it (FACTS.md §1, §4).

The SLURM environments below are copied from a real slurm-wlm 22.05 cluster (two emulated nodes n1, n2; job 1 run
with `sbatch -N2 --ntasks-per-node=2`): the batch script, a task of `srun` (step 0, four tasks) and a task of
`srun --ntasks-per-node=1 --ntasks=2` (step 1, one launcher per node).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.cluster import (
    ClusterEnvironment,
    SlurmEnvironment,
    TorchrunEnvironment,
    derive_port,
    detect_environment,
    in_srun_step,
    parse_tasks_per_node,
    slurm_node_info,
)
from ddpboot.cluster.slurm import PORT_BASE, PORT_SPAN
from ddpboot.errors import UsageError, WorkerEnvError

# --- measured SLURM environments -------------------------------------------------------------------------

SBATCH_SCRIPT = {
    "SLURM_JOBID": "1",
    "SLURM_JOB_ID": "1",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}

# `srun` in that job: task 3 of 4, second task on the second node
SRUN_TASK = {
    **SBATCH_SCRIPT,
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "3",
    "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}

# `srun --ntasks-per-node=1 --ntasks=2` in that job: the launcher on the second node
SRUN_LAUNCHER = {
    **SBATCH_SCRIPT,
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEPID": "1",
    "SLURM_STEP_ID": "1",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}

# `srun -N1 -n1` in that job: a one-task step on n1 only; the job's node list still names both nodes
SRUN_ONE_TASK = {
    **SBATCH_SCRIPT,
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "1",
    "SLURM_STEPID": "2",
    "SLURM_STEP_ID": "2",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1",
}


def torchrun_env(
    rank: int = 5, local_rank: int = 1, world_size: int = 8, local_world_size: int = 4, node: int = 1, nnodes: int = 2
) -> dict[str, str]:
    """What torchrun gives a worker (FACTS.md §1)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def layout(env: ClusterEnvironment) -> tuple[int, int, int, int, int, int, str, int]:
    return (
        env.global_rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        env.node_rank,
        env.nnodes,
        env.main_address,
        env.main_port,
    )


# --- precedence ------------------------------------------------------------------------------------------


def test_plain_process_has_no_environment() -> None:
    assert detect_environment({}) is None
    assert detect_environment({"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}) is None


def test_sbatch_script_is_not_rank_0_of_a_step() -> None:
    # SLURM_PROCID=0 and SLURM_NTASKS=4 are set in the batch script, but no srun step runs it
    assert not in_srun_step(SBATCH_SCRIPT)
    assert not SlurmEnvironment.detect(SBATCH_SCRIPT)
    assert detect_environment(SBATCH_SCRIPT) is None


def test_srun_task_is_a_slurm_rank() -> None:
    env = detect_environment(SRUN_TASK)
    assert isinstance(env, SlurmEnvironment)
    assert layout(env) == (3, 4, 1, 2, 1, 2, "n1", derive_port(1, 0))


def test_one_task_step_is_a_plain_process() -> None:
    assert in_srun_step(SRUN_ONE_TASK)
    assert detect_environment(SRUN_ONE_TASK) is None


def test_torchrun_wins_over_slurm_for_workers_of_a_launcher_under_srun() -> None:
    # one launcher per node under srun; its workers inherit the launcher's SLURM_* and get the torchrun contract
    worker = {**SRUN_LAUNCHER, **torchrun_env(rank=6, local_rank=2, world_size=8, local_world_size=4, node=1)}
    env = detect_environment(worker)
    assert isinstance(env, TorchrunEnvironment)
    assert layout(env) == (6, 8, 2, 4, 1, 2, "10.1.2.3", 29500)


def test_env_init_vars_without_run_id_are_torchrun_style() -> None:
    env = torchrun_env()
    del env["TORCHELASTIC_RUN_ID"]
    assert isinstance(detect_environment(env), TorchrunEnvironment)
    del env["MASTER_PORT"]  # no longer the env:// contract, and no run id
    assert detect_environment(env) is None


def test_run_id_alone_is_detected_and_then_reports_what_is_missing() -> None:
    # a half-set torchrun environment fails loudly instead of falling back to a single process
    with pytest.raises(WorkerEnvError, match=r"WORLD_SIZE is not set.*TORCHELASTIC_RUN_ID"):
        detect_environment({"TORCHELASTIC_RUN_ID": "abc"})


def test_detect_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_")) or name in torchrun_env():
            monkeypatch.delenv(name)
    assert detect_environment() is None
    for name, value in torchrun_env().items():
        monkeypatch.setenv(name, value)
    env = detect_environment()
    assert isinstance(env, TorchrunEnvironment)
    assert env.global_rank == 5


# --- torchrun --------------------------------------------------------------------------------------------


def test_torchrun_values() -> None:
    env = TorchrunEnvironment(torchrun_env())
    assert layout(env) == (5, 8, 1, 4, 1, 2, "10.1.2.3", 29500)
    assert not env.launched_by_ddpboot
    assert env.isolation is None
    assert "rank 5/8" in env.describe()


def test_rank_isolation_reports_the_true_local_rank() -> None:
    # ddpboot exports LOCAL_RANK=0 under rank isolation; the true node-local index is DDPBOOT_LOCAL_RANK
    env = TorchrunEnvironment(
        {**torchrun_env(rank=7, local_rank=0), "DDPBOOT_LOCAL_RANK": "3", "DDPBOOT_ISOLATION": "rank"}
    )
    assert env.local_rank == 3
    assert env.launched_by_ddpboot
    assert env.isolation == "rank"


def test_node_isolation_local_rank_is_local_rank() -> None:
    env = TorchrunEnvironment({**torchrun_env(), "DDPBOOT_LOCAL_RANK": "1", "DDPBOOT_ISOLATION": "node"})
    assert (env.local_rank, env.isolation) == (1, "node")


def test_group_variables_are_derived_from_torchrun_layout_when_absent() -> None:
    env = torchrun_env(rank=5, local_rank=1, world_size=8, local_world_size=4)
    del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    t = TorchrunEnvironment(env)
    assert (t.node_rank, t.nnodes) == (1, 2)


def test_group_world_size_cannot_be_derived_for_uneven_nodes() -> None:
    env = torchrun_env(rank=5, local_rank=1, world_size=6, local_world_size=4)
    del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    with pytest.raises(WorkerEnvError, match=r"GROUP_WORLD_SIZE is not set.*WORLD_SIZE=6.*LOCAL_WORLD_SIZE=4"):
        TorchrunEnvironment(env)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RANK": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
        ({"RANK": "x"}, "RANK='x' is not an integer"),
        ({"RANK": "-1"}, "RANK='-1' is not an integer"),
        ({"RANK": ""}, "RANK is not set"),
        ({"RANK": None}, "RANK is not set"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be at least 1"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"LOCAL_RANK": None}, "LOCAL_RANK is not set"),
        ({"LOCAL_WORLD_SIZE": None}, "LOCAL_WORLD_SIZE is not set"),
        ({"LOCAL_WORLD_SIZE": "16"}, "LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8"),
        ({"DDPBOOT_LOCAL_RANK": "4"}, "DDPBOOT_LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"DDPBOOT_LOCAL_RANK": "one"}, "DDPBOOT_LOCAL_RANK='one'"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"),
        ({"GROUP_WORLD_SIZE": "9"}, "GROUP_WORLD_SIZE=9 is larger than WORLD_SIZE=8"),
        ({"GROUP_RANK": None, "GROUP_WORLD_SIZE": "1"}, "RANK // LOCAL_WORLD_SIZE=1 is not below GROUP_WORLD_SIZE"),
        ({"MASTER_ADDR": None}, "MASTER_ADDR is not set"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0' must be at least 1"),
        ({"MASTER_PORT": "29500a"}, "MASTER_PORT='29500a'"),
    ],
)
def test_torchrun_errors_name_the_variable(change: dict[str, str | None], message: str) -> None:
    env = torchrun_env()
    for name, value in change.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with pytest.raises(WorkerEnvError) as info:
        TorchrunEnvironment(env)
    assert message in str(info.value)


@given(
    nnodes=st.integers(1, 8),
    nproc=st.integers(1, 8),
    data=st.data(),
    isolated=st.booleans(),
    drop_groups=st.booleans(),
)
def test_any_torchrun_layout_reads_back(
    nnodes: int, nproc: int, data: st.DataObject, isolated: bool, drop_groups: bool
) -> None:
    node = data.draw(st.integers(0, nnodes - 1))
    local = data.draw(st.integers(0, nproc - 1))
    rank = node * nproc + local  # torchrun's layout: consecutive ranks per node
    env = torchrun_env(rank, local, nnodes * nproc, nproc, node, nnodes)
    if isolated:
        env.update(LOCAL_RANK="0", DDPBOOT_LOCAL_RANK=str(local), DDPBOOT_ISOLATION="rank")
    if drop_groups:
        del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    got = detect_environment(env)
    assert got is not None
    assert layout(got) == (rank, nnodes * nproc, local, nproc, node, nnodes, "10.1.2.3", 29500)


# --- SLURM parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "counts"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("1(x2)", [1, 1]),
        ("8,4(x2),8", [8, 4, 4, 8]),
        ("3(x1)", [3]),
    ],
)
def test_parse_tasks_per_node(value: str, counts: list[int]) -> None:
    assert parse_tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["", "a", "2(3)", "2(x3", "2(x0)", "0", "2,,1", "-1", "1(x999999999)", "2(x٣)"])
def test_parse_tasks_per_node_rejects(value: str) -> None:
    with pytest.raises(WorkerEnvError, match="SLURM_STEP_TASKS_PER_NODE="):
        parse_tasks_per_node(value, "SLURM_STEP_TASKS_PER_NODE")


def test_derive_port_is_pinned() -> None:
    # every task of a step computes the port on its own: the formula must not drift between versions
    assert derive_port(1, 0) == 15001
    assert derive_port(1, 1) == 15001 + 4099
    assert derive_port(123456, 3) == PORT_BASE + (123456 + 3 * 4099) % PORT_SPAN


@given(job=st.integers(0, 2**32), step=st.integers(0, 2**31))
def test_derived_ports_stay_in_range_and_neighbours_differ(job: int, step: int) -> None:
    port = derive_port(job, step)
    assert PORT_BASE <= port < PORT_BASE + PORT_SPAN < 32768  # below Linux's ephemeral range
    assert derive_port(job + 1, step) != port  # consecutive jobs sharing a node
    assert derive_port(job, step + 1) != port  # two steps of one job


def test_derive_port_rejects_negative_ids() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        derive_port(-1, 0)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ({"SLURM_STEP_ID": "0"}, True),
        ({"SLURM_STEPID": "7"}, True),  # older spelling only
        ({"SLURM_STEP_ID": "4294967291"}, False),  # the batch step's id
        ({"SLURM_STEP_ID": "4294967292"}, False),  # extern
        ({"SLURM_STEP_ID": "batch"}, False),
        ({"SLURM_STEP_ID": ""}, False),
        ({}, False),
    ],
)
def test_in_srun_step(step: dict[str, str], expected: bool) -> None:
    assert in_srun_step({**SBATCH_SCRIPT, **step}) is expected


# --- SLURM task per GPU ------------------------------------------------------------------------------------


def test_slurm_prefers_step_values_to_job_values() -> None:
    # a 4-task step on the job's last two nodes of four, with stale job-level values around it
    env = {
        **SRUN_TASK,
        "SLURM_JOB_NODELIST": "gpu[01-04]",
        "SLURM_NODELIST": "gpu[01-04]",
        "SLURM_STEP_NODELIST": "gpu[03-04]",
        "SLURM_NNODES": "4",
        "SLURM_TASKS_PER_NODE": "2(x4)",
        "SLURM_NTASKS": "8",
    }
    assert layout(SlurmEnvironment(env)) == (3, 4, 1, 2, 1, 2, "gpu03", derive_port(1, 0))


def test_slurm_falls_back_to_job_values_without_step_ones() -> None:
    env = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP_") or k == "SLURM_STEP_ID"}
    env["SLURM_NODELIST"] = env["SLURM_JOB_NODELIST"] = "rack[1-2]-n[01-02]"
    env.update(SLURM_NNODES="4", SLURM_TASKS_PER_NODE="1(x4)", SLURM_NODEID="3", SLURM_LOCALID="0")
    assert layout(SlurmEnvironment(env)) == (3, 4, 0, 1, 3, 4, "rack1-n01", derive_port(1, 0))


def test_slurm_uneven_tasks_per_node() -> None:
    env = {
        **SRUN_TASK,
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
        "SLURM_PROCID": "4",
        "SLURM_NODEID": "2",
        "SLURM_LOCALID": "0",
    }
    s = SlurmEnvironment(env)
    assert (s.local_world_size, s.node_rank, s.nnodes, s.world_size) == (1, 2, 3, 5)


def test_slurm_honours_master_port_but_not_master_addr() -> None:
    # sbatch exports the submitting shell's environment: a stale MASTER_ADDR must not redirect every node
    s = SlurmEnvironment({**SRUN_TASK, "MASTER_PORT": "23456", "MASTER_ADDR": "localhost"})
    assert (s.main_address, s.main_port) == ("n1", 23456)


def test_slurm_with_a_garbled_task_count_is_detected_then_reported() -> None:
    env = {**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "four"}
    assert SlurmEnvironment.detect(env)
    with pytest.raises(WorkerEnvError, match="SLURM_STEP_NUM_TASKS='four'"):
        detect_environment(env)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE[node 1]=2"),
        ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not below SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "describes 3 nodes but SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, "adds up to 6 tasks but SLURM_STEP_NUM_TASKS=4"),
        ({"SLURM_STEP_TASKS_PER_NODE": None, "SLURM_TASKS_PER_NODE": None}, "SLURM_STEP_TASKS_PER_NODE or"),
        ({"SLURM_STEP_NODELIST": "n[1-2"}, "SLURM_STEP_NODELIST cannot be read"),
        ({"SLURM_JOB_ID": None, "SLURM_JOBID": None}, "SLURM_JOB_ID or SLURM_JOBID is not set"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ],
)
def test_slurm_errors_name_the_variable(change: dict[str, str | None], message: str) -> None:
    env = dict(SRUN_TASK)
    for name, value in change.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with pytest.raises(WorkerEnvError) as info:
        SlurmEnvironment(env)
    assert message in str(info.value)


# --- SLURM, one launcher per node --------------------------------------------------------------------------


def test_slurm_node_info_for_a_launcher_per_node() -> None:
    info = slurm_node_info(SRUN_LAUNCHER)
    assert info == (2, 1, "n1", derive_port(1, 1))
    assert (info.nnodes, info.node_rank, info.master_addr, info.master_port) == tuple(info)
    assert slurm_node_info({**SRUN_LAUNCHER, "MASTER_PORT": "20000"}).master_port == 20000


def test_slurm_node_info_outside_srun_says_how_to_start() -> None:
    with pytest.raises(UsageError, match=r"srun --ntasks-per-node=1 --ntasks=\$SLURM_NNODES"):
        slurm_node_info(SBATCH_SCRIPT)


def test_slurm_node_info_refuses_two_launchers_on_a_node() -> None:
    # `srun ddpboot ...` in a job with --ntasks-per-node=2 starts two launchers per node
    with pytest.raises(UsageError, match="srun started 2 ddpboot launchers on this node"):
        slurm_node_info(SRUN_TASK)
