"""SLURM: the ranks of a srun task (`SlurmEnvironment`), which GPU it keeps, and the node layout one ddpboot
launcher per node reads (`slurm_node_info`).

The SLURM environments below are copied from a real slurm-wlm 22.05 cluster (two emulated nodes n1, n2; job 1 run
with `sbatch -N2 --ntasks-per-node=2`): the batch script, a task of `srun` (step 0, four tasks) and a task of
`srun --ntasks-per-node=1 --ntasks=2` (step 1, one launcher per node).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.cluster import (
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

TorchrunVars = Callable[..., dict[str, str]]
Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]
UUID_A = "GPU-8c3f2b1a-0000-1111-2222-333344445555"
UUID_B = "GPU-9d4e3c2b-6666-7777-8888-99990000aaaa"

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


# --- detection ------------------------------------------------------------------------------------------


def test_sbatch_script_is_not_rank_0_of_a_step() -> None:
    # SLURM_PROCID=0 and SLURM_NTASKS=4 are set in the batch script, but no srun step runs it
    assert not in_srun_step(SBATCH_SCRIPT)
    assert not SlurmEnvironment.detect(SBATCH_SCRIPT)
    assert detect_environment(SBATCH_SCRIPT) is None


def test_srun_task_is_a_slurm_rank(layout: Layout) -> None:
    env = detect_environment(SRUN_TASK)
    assert isinstance(env, SlurmEnvironment)
    assert layout(env) == (3, 4, 1, 2, 1, 2, "n1", derive_port(1, 0))


def test_one_task_step_is_a_plain_process() -> None:
    assert in_srun_step(SRUN_ONE_TASK)
    assert detect_environment(SRUN_ONE_TASK) is None


def test_torchrun_wins_over_slurm_for_workers_of_a_launcher_under_srun(
    torchrun_vars: TorchrunVars, layout: Layout
) -> None:
    # one launcher per node under srun; its workers inherit the launcher's SLURM_* and get the torchrun contract
    worker = {**SRUN_LAUNCHER, **torchrun_vars(rank=6, local_rank=2, world_size=8, local_world_size=4, node=1)}
    env = detect_environment(worker)
    assert isinstance(env, TorchrunEnvironment)
    assert layout(env) == (6, 8, 2, 4, 1, 2, "10.1.2.3", 29500)


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


def test_slurm_prefers_step_values_to_job_values(layout: Layout) -> None:
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


def test_slurm_falls_back_to_job_values_without_step_ones(layout: Layout) -> None:
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


# --- which GPU a task keeps --------------------------------------------------------------------------------


def one_node_task(local_rank: int, tasks: int, **extra: str) -> SlurmEnvironment:
    """Task `local_rank` of a one-node step of `tasks` tasks."""
    return SlurmEnvironment(
        {
            **SRUN_TASK,
            "SLURM_STEP_NUM_TASKS": str(tasks),
            "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_TASKS_PER_NODE": str(tasks),
            "SLURM_STEP_NODELIST": "n1",
            "SLURM_PROCID": str(local_rank),
            "SLURM_NODEID": "0",
            "SLURM_LOCALID": str(local_rank),
            **extra,
        }
    )


def test_a_task_narrows_to_its_own_gpu() -> None:
    env = one_node_task(1, 2)
    assert env.narrows_visible_devices and env.exports_contract
    assert (env.name, env.local_rank_var, env.device_index, env.task_noun) == ("slurm", "SLURM_LOCALID", 1, "srun task")


@pytest.mark.parametrize(
    ("entries", "count", "local_rank", "tasks", "per_task", "expected"),
    [
        (None, 4, 2, 4, False, "2"),  # every GPU visible: the task's index (CUDA_DEVICE_ORDER=PCI_BUS_ID set too)
        (("4", "5", "6", "7"), 4, 1, 4, False, "5"),  # SLURM gave global indices: keep its spelling
        ((UUID_A, UUID_B), 2, 1, 2, False, UUID_B),
        (None, 8, 3, 4, False, "3"),  # more GPUs than tasks: task i takes GPU i
        (("3",), 1, 1, 2, False, None),  # --gpus-per-task / cgroup: already its own GPU
        (("0", "1"), 2, 1, 2, True, None),  # --gpus-per-task=2: the task's own list, use its first
        ((), 0, 1, 2, False, None),  # CPU
    ],
)
def test_own_visible_devices(
    entries: tuple[str, ...] | None, count: int, local_rank: int, tasks: int, per_task: bool, expected: str | None
) -> None:
    extra = {"SLURM_GPUS_PER_TASK": "2"} if per_task else {}
    assert one_node_task(local_rank, tasks, **extra).own_visible_devices(entries, count) == expected


def test_more_tasks_than_gpus_is_refused() -> None:
    with pytest.raises(WorkerEnvError, match="srun started 4 tasks on this node but this task sees 2 GPUs"):
        one_node_task(3, 4).own_visible_devices(None, 2)


@given(st.integers(1, 8).flatmap(lambda tasks: st.tuples(st.just(tasks), st.integers(tasks, 16))), st.booleans())
def test_tasks_of_a_node_get_distinct_gpus(sizes: tuple[int, int], as_list: bool) -> None:
    tasks, count = sizes
    entries = tuple(str(10 + i) for i in range(count)) if as_list else None
    picks = [one_node_task(r, tasks).own_visible_devices(entries, count) or "0" for r in range(tasks)]
    assert len(set(picks)) == tasks


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
