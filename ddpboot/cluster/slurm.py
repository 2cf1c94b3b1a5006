"""SLURM: ranks of a task started by `srun`, and node rank/count for one ddpboot launcher per node.

Two launch patterns:

1. One task per GPU, no launcher: `srun --ntasks-per-node=G python train.py`. Each task is one rank;
   `SlurmEnvironment` reads its ranks from SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID and the step's sizes.
2. One launcher per node: `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES ddpboot ...`. The launcher needs only
   the node count, its node rank and the store address: `slurm_node_info`. Its workers then get the torchrun
   variables, which take precedence over the SLURM_* ones they also inherit.

A batch script is not a srun step. Inside `sbatch` (outside srun) SLURM sets SLURM_PROCID=0, SLURM_LOCALID=0,
SLURM_NODEID=0 and SLURM_NTASKS to the job's task count, but no step id (measured, slurm 22.05). Reading ranks
there would make a single process wait for ranks that never start, so only a process with a numeric
SLURM_STEP_ID (or its older spelling SLURM_STEPID) counts as a srun task. The special steps SLURM shows as
"batch", "extern", "interactive" have ids near 2**32 (0xFFFFFFFA..) and do not count either.

Inside a step the STEP_ variables describe the step, which may be smaller than the job (`srun -N1` in a 2-node job:
SLURM_STEP_NODELIST=n1 but SLURM_JOB_NODELIST=n[1-2]), so they are read first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ddpboot.cluster.base import (
    PORT_BASE,
    PORT_SPAN,
    TaskEnvironment,
    check_below,
    first_set,
    read_int,
    require,
    store_port,
)
from ddpboot.cluster.hostlist import MAX_HOSTS, expand_hostlist, first_host
from ddpboot.errors import DdpbootError, UsageError, WorkerEnvError

_SPECIAL_STEP_IDS = 0xFFFFFFF0  # batch, extern, interactive, pending: SLURM's reserved ids are above this

_STEP_ID_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")
_JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
_NTASKS_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_NNODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES")
_TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")

_CONTEXT = "SLURM sets it for every task that srun starts; is this process running under srun?"

_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def parse_tasks_per_node(value: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Tasks on each node, in node order: `2(x3),1` -> [2, 2, 2, 1]. `variable` only names the source in errors."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if match is None or not item.isascii():
            raise WorkerEnvError(
                f"{variable}={value!r}: {item!r} is not a task count like '2' or '2(x3)' (two tasks on each of "
                "three nodes)."
            )
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if tasks < 1 or repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise WorkerEnvError(f"{variable}={value!r}: {item!r} is not a plausible task count.")
        counts += [tasks] * repeat
    return counts


def derive_port(job_id: int, step_id: int) -> int:
    """The store port for a job step when MASTER_PORT is not set; every task of the step computes the same one.

    PORT_BASE + (job_id + 4099 * step_id) mod PORT_SPAN. Jobs sharing a node usually have nearby ids, and
    consecutive job ids always get different ports; the steps of one job differ too (4099 is prime to PORT_SPAN,
    so two steps collide only if their ids differ by a multiple of PORT_SPAN).
    """
    if job_id < 0 or step_id < 0:
        raise ValueError(f"job and step ids are non-negative, got job_id={job_id}, step_id={step_id}")
    return PORT_BASE + (job_id + 4099 * step_id) % PORT_SPAN


def in_srun_step(env: Mapping[str, str]) -> bool:
    """Whether this process is a task of a srun job step (not the batch script, an salloc shell or a plain shell)."""
    found = first_set(env, _STEP_ID_VARS)
    return found is not None and found[1].isdecimal() and found[1].isascii() and int(found[1]) < _SPECIAL_STEP_IDS


def slurm_step(env: Mapping[str, str]) -> str | None:
    """`JOB.STEP` of the srun step this process runs in (SLURM_JOB_ID / SLURM_JOBID and SLURM_STEP_ID /
    SLURM_STEPID), None outside a step: the same on every node of the step."""
    job, step = first_set(env, _JOB_ID_VARS), first_set(env, _STEP_ID_VARS)
    if job is None or step is None or not in_srun_step(env):
        return None
    return f"{job[1]}.{step[1]}"


def slurm_main_address(env: Mapping[str, str]) -> str:
    """First host of the step's node list (node 0 of the step, where the rendezvous store runs).

    MASTER_ADDR is deliberately not honoured: sbatch exports the submitting shell's environment by default, so a
    stale MASTER_ADDR=localhost from an earlier experiment would send every node to itself.
    """
    var, nodelist = require(env, _NODELIST_VARS, _CONTEXT)
    try:
        return first_host(nodelist)
    except DdpbootError as exc:
        raise WorkerEnvError(f"{var} cannot be read: {exc}") from exc


def slurm_main_port(env: Mapping[str, str]) -> int:
    """MASTER_PORT when set (the same on every task: sbatch and srun propagate it), else `derive_port`."""
    return store_port(env, lambda: derive_port(read_int(env, _JOB_ID_VARS, _CONTEXT)[1],
                                               read_int(env, _STEP_ID_VARS, _CONTEXT)[1]))


def slurm_node_list(env: Mapping[str, str]) -> list[str]:
    """Every host of the step's node list, in order (as `scontrol show hostnames` expands it)."""
    var, nodelist = require(env, _NODELIST_VARS, _CONTEXT)
    try:
        return expand_hostlist(nodelist)
    except DdpbootError as exc:
        raise WorkerEnvError(f"{var} cannot be read: {exc}") from exc


class SlurmNodeInfo(NamedTuple):
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def slurm_node_info(env: Mapping[str, str]) -> SlurmNodeInfo:
    """Node count, this node's rank and the store address for a ddpboot launcher started by srun, one per node.

    Raises UsageError outside a srun step, or when srun started more than one launcher on this node (each would
    claim the same node rank and wait for the other forever).
    """
    if not in_srun_step(env):
        raise UsageError(
            "ddpboot reads the node count and node rank from a srun job step, and this process is not one "
            "(no numeric SLURM_STEP_ID: a batch script or salloc shell?). Start one launcher per node with "
            "`srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES ddpboot ...`, or pass --nnodes/--node-rank."
        )
    nnodes_var, nnodes = read_int(env, _NNODES_VARS, _CONTEXT, minimum=1)
    _, node_rank = read_int(env, "SLURM_NODEID", _CONTEXT)
    check_below("SLURM_NODEID", node_rank, nnodes_var, nnodes)
    here = _tasks_per_node(env, nnodes_var, nnodes)[1][node_rank]
    if here != 1:
        raise UsageError(
            f"srun started {here} ddpboot launchers on this node (node {node_rank}); ddpboot needs exactly one "
            "per node, which then starts one worker per GPU. Use "
            "`srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES ddpboot ...` (pass --ntasks explicitly: the job's "
            "SLURM_NTASKS is also read by srun)."
        )
    return SlurmNodeInfo(nnodes, node_rank, slurm_main_address(env), slurm_main_port(env))


def _tasks_per_node(env: Mapping[str, str], nnodes_var: str, nnodes: int) -> tuple[str, list[int]]:
    """(variable read, tasks on each node of the step), checked against the node count."""
    var, raw = require(env, _TASKS_PER_NODE_VARS, _CONTEXT)
    counts = parse_tasks_per_node(raw, var)
    if len(counts) != nnodes:
        raise WorkerEnvError(f"{var}={raw!r} describes {len(counts)} nodes but {nnodes_var}={nnodes}.")
    return var, counts


class SlurmEnvironment(TaskEnvironment, name="slurm", local_rank_var="SLURM_LOCALID", task_noun="srun task",
                       started_by="srun"):
    """One srun task per rank (`srun --ntasks-per-node=G python train.py`): ranks from SLURM_* variables.

    Detected only inside a srun step with more than one task: a single task is as good as plain python, and the
    batch script (which also has SLURM_PROCID=0) is not a step.
    """

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        if not in_srun_step(env) or first_set(env, ["SLURM_PROCID"]) is None:
            return False
        ntasks = first_set(env, _NTASKS_VARS)
        if ntasks is None:
            return False
        # A garbled count is detected, so that the constructor reports it instead of silently running alone.
        return not ntasks[1].isdecimal() or int(ntasks[1]) > 1

    def __init__(self, env: Mapping[str, str]) -> None:
        ntasks_var, self._world_size = read_int(env, _NTASKS_VARS, _CONTEXT, minimum=1)
        _, self._rank = read_int(env, "SLURM_PROCID", _CONTEXT)
        check_below("SLURM_PROCID", self._rank, ntasks_var, self._world_size)

        nnodes_var, self._nnodes = read_int(env, _NNODES_VARS, _CONTEXT, minimum=1)
        _, self._node_rank = read_int(env, "SLURM_NODEID", _CONTEXT)
        check_below("SLURM_NODEID", self._node_rank, nnodes_var, self._nnodes)

        tasks_var, counts = _tasks_per_node(env, nnodes_var, self._nnodes)
        if sum(counts) != self._world_size:
            raise WorkerEnvError(
                f"{tasks_var}={env[tasks_var]!r} adds up to {sum(counts)} tasks but {ntasks_var}={self._world_size}."
            )
        self._local_world_size = counts[self._node_rank]
        _, self._local_rank = read_int(env, "SLURM_LOCALID", _CONTEXT)
        check_below("SLURM_LOCALID", self._local_rank, f"{tasks_var}[node {self._node_rank}]", self._local_world_size)

        self._main_address = slurm_main_address(env)
        self._main_port = slurm_main_port(env)
        # With --gpus-per-task SLURM gives every task its own list already, whose first entry is the task's GPU.
        self._gpus_per_task = first_set(env, ["SLURM_GPUS_PER_TASK"]) is not None

    def own_visible_devices(self, entries: Sequence[str] | None, visible_count: int) -> str | None:
        """Narrow only when the task sees several GPUs that are the node's (one task per GPU, no `--gpus-per-task`):
        task SLURM_LOCALID=i then takes entry i of the list (or index i when the variable is unset)."""
        return None if self._gpus_per_task else super().own_visible_devices(entries, visible_count)

    def fewer_tasks(self, visible_count: int) -> str:
        return f"srun --ntasks-per-node={visible_count}, or give each task its own GPU with --gpus-per-task=1."
