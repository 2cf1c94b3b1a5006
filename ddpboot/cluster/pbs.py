"""PBS (Torque, OpenPBS, PBS Professional): ranks started by `pbsdsh`, and the node file both patterns read.

A PBS job's hosts are in the file PBS_NODEFILE, one line per slot (a host with 4 slots appears 4 times, its lines
together), in the order PBS gave them; PBS_JOBID names the job. Under `mpiexec` the MPI launcher's variables
describe each rank (`ddpboot.cluster.mpi`); this module reads the `pbsdsh` case, where the PBS task manager starts
the processes itself:

- Torque's pbs_mom gives every task PBS_TASKNUM (the job's task id, counted from 1 on the first node, where task 1
  is the batch script itself), PBS_NODENUM (the index of the task's node among the job's nodes) and PBS_VNODENUM
  (the line of the node file the task was started for; 0 in the batch script).
- `pbsdsh prog` starts one task per line of the node file: task k is rank k (PBS_VNODENUM), the world is the number
  of lines, and rank 0 runs on the first host, which is where the store listens. `pbsdsh -u` starts one per host:
  the pattern for one ddpboot launcher per node (`pbs_node_info`).

A process is a pbsdsh task when PBS_VNODENUM is set and PBS_TASKNUM is above 1: the batch script has the same
variables with task 1, and reading it as rank 0 of the node file would make it wait for ranks that never start.

Torque writes the node file on the job's first host only (pbs_mom sets PBS_NODEFILE where it has the file, its
src/resmom/start_exec.c): a task on any other host (a "sister") gets PBS_JOBID, PBS_NODENUM, PBS_TASKNUM and
PBS_VNODENUM but no PBS_NODEFILE. So a launcher there needs node 0's host and the node count given
(`MASTER_ADDR=$(head -1 $PBS_NODEFILE) ddpboot --nnodes N ...`, expanded by the batch script before pbsdsh runs);
a rank there needs the node file on a shared filesystem (`PBS_NODEFILE=DIR/nodes`). Both say so when missing.

The store's port, unless MASTER_PORT is set, is derived from PBS_JOBID and the command the step runs (the same for
every task of one pbsdsh step): two steps of one job that run at once with different commands get different ports.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ddpboot.cluster.base import (
    TaskEnvironment,
    check_below,
    first_set,
    job_port_of,
    read_int,
    require,
    store_port,
)
from ddpboot.errors import WorkerEnvError

_CONTEXT = "PBS sets it for every task of a job; is this process running under PBS (qsub, then pbsdsh)?"


def read_node_file(env: Mapping[str, str]) -> list[str]:
    """PBS_NODEFILE's hosts, one per slot, in order."""
    _, path = require(env, "PBS_NODEFILE", _CONTEXT)
    try:
        with open(path, encoding="utf-8") as f:
            hosts = [line.strip() for line in f if line.strip()]
    except OSError as exc:
        raise WorkerEnvError(f"PBS_NODEFILE={path!r} cannot be read: {exc.strerror}.") from None
    if not hosts:
        raise WorkerEnvError(f"PBS_NODEFILE={path!r} is empty: PBS lists the job's hosts there, one per slot.")
    return hosts


def unique_hosts(hosts: Sequence[str]) -> list[str]:
    """The hosts in order of first appearance."""
    return list(dict.fromkeys(hosts))


def in_pbsdsh_task(env: Mapping[str, str]) -> bool:
    """Whether this process is a task pbsdsh started (not the batch script, task 1)."""
    task = first_set(env, ["PBS_TASKNUM"])
    return (first_set(env, ["PBS_JOBID"]) is not None and first_set(env, ["PBS_VNODENUM"]) is not None
            and task is not None and task[1].isdecimal() and int(task[1]) > 1)


def pbs_port(env: Mapping[str, str], step: str = "") -> int:
    """MASTER_PORT when set, else derived from PBS_JOBID and `step`, the command every task of one pbsdsh step
    runs (so that two steps running at once get different ports)."""
    return store_port(env, lambda: job_port_of(env, [require(env, "PBS_JOBID", _CONTEXT)[0]], step))


SISTER_LAUNCHER_FIX = (
    "Torque writes PBS_NODEFILE on the job's first host only, so a launcher on another host needs node 0's host and "
    "the node count given. In the batch script (on the first host), let the shell fill them in before pbsdsh runs: "
    'pbsdsh -u -- bash -lc "cd $PBS_O_WORKDIR && MASTER_ADDR=$(head -1 $PBS_NODEFILE) ddpboot --nnodes $(sort -u '
    '$PBS_NODEFILE | wc -l) --nproc N train.py".'
)
SISTER_RANK_FIX = (
    "Torque writes PBS_NODEFILE on the job's first host only, and a rank on another host needs the whole node file. "
    'In the batch script, copy it where every host reads it and name it in the command: cp "$PBS_NODEFILE" '
    '"$PBS_O_WORKDIR/nodes.$PBS_JOBID"; pbsdsh -- bash -lc "cd $PBS_O_WORKDIR && '
    'PBS_NODEFILE=$PBS_O_WORKDIR/nodes.$PBS_JOBID python train.py".'
)


class PbsNodeInfo(NamedTuple):
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int


def pbs_node_info(env: Mapping[str, str], nnodes: int | None = None, step: str = "") -> PbsNodeInfo:
    """Node count (hosts of the node file), this node's rank (PBS_NODENUM) and the store address (the first host)
    for one launcher per host (`pbsdsh -u ddpboot ...`). On a sister host (no PBS_NODEFILE): MASTER_ADDR and
    `nnodes` (--nnodes), which must then be given; `step` is the step's command (pbs_port)."""
    _, node = read_int(env, "PBS_NODENUM", _CONTEXT)
    if first_set(env, ["PBS_NODEFILE"]) is None:
        master = first_set(env, ["MASTER_ADDR"])
        if master is None or nnodes is None:
            missing = " and ".join(n for n, v in (("--master-addr (or MASTER_ADDR)", master), ("--nnodes", nnodes))
                                   if v is None)
            raise WorkerEnvError(f"this pbsdsh task (PBS_NODENUM={node}) has no PBS_NODEFILE, and {missing} "
                                 f"{'is' if ' and ' not in missing else 'are'} not given. {SISTER_LAUNCHER_FIX}")
        check_below("PBS_NODENUM", node, "--nnodes", nnodes)
        return PbsNodeInfo(nnodes, node, master[1], pbs_port(env, step))
    hosts = unique_hosts(read_node_file(env))
    check_below("PBS_NODENUM", node, "the hosts of PBS_NODEFILE", len(hosts))
    return PbsNodeInfo(len(hosts), node, hosts[0], pbs_port(env, step))


class PbsEnvironment(TaskEnvironment, name="pbs", local_rank_var="the PBS local rank", task_noun="pbsdsh task",
                     started_by="pbsdsh"):
    """One pbsdsh task per slot of the node file (`pbsdsh python train.py`, or `pbsdsh -- bash -lc '...'`)."""

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return in_pbsdsh_task(env)

    def __init__(self, env: Mapping[str, str], step: str | None = None) -> None:
        """`step`: the command every task of the pbsdsh step runs, for the port (default: this process's)."""
        if first_set(env, ["PBS_NODEFILE"]) is None:
            raise WorkerEnvError(f"this pbsdsh task (PBS_VNODENUM={env.get('PBS_VNODENUM', '')}) has no PBS_NODEFILE. "
                                 f"{SISTER_RANK_FIX}")
        slots = read_node_file(env)
        self._world_size = len(slots)
        _, self._rank = read_int(env, "PBS_VNODENUM", _CONTEXT)
        check_below("PBS_VNODENUM", self._rank, "the lines of PBS_NODEFILE", self._world_size)
        host = slots[self._rank]
        self._local_rank = slots[: self._rank].count(host)
        self._local_world_size = slots.count(host)
        hosts = unique_hosts(slots)
        self._nnodes, self._node_rank = len(hosts), hosts.index(host)
        self._main_address = slots[0]
        self._main_port = pbs_port(env, shlex.join(sys.orig_argv) if step is None else step)

    def fewer_tasks(self, visible_count: int) -> str:
        return "request as many slots (ppn / ncpus) per host as it has GPUs, or use mpiexec."
