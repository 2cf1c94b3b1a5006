"""LSF: ranks started by `jsrun` (IBM Job Step Manager, the launcher of LSF's CSM clusters such as Summit).

jsrun gives every task JSM_NAMESPACE_RANK, JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK and
JSM_NAMESPACE_LOCAL_SIZE; nothing else sets them, so they are how such a process is recognised. The job's hosts are
in LSB_DJOB_HOSTFILE (one line per slot) or LSB_MCPU_HOSTS (`host slots host slots ...`), but on CSM clusters the
first of them is the launch node, which runs no task, and which host jsrun gave rank 0 depends on its resource-set
options, so the store address is read as for MPI: MASTER_ADDR, or loopback when every task runs on this host.
MASTER_PORT, else a port derived from the job step (PMIX_NAMESPACE, which jsrun sets per step, else LSB_JOBID).

`lsf_hosts` reads LSF's host lists, which the message naming what to export shows.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpboot.cluster.base import (
    TaskEnvironment,
    first_set,
    job_port_of,
    read_ranks,
    store_host,
    store_port,
)
from ddpboot.errors import WorkerEnvError

_RANK, _SIZE = "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"
_LOCAL_RANK, _LOCAL_SIZE = "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE"
_CONTEXT = "jsrun sets it for every task it starts."


def _address_fix(env: Mapping[str, str]) -> str:
    """What to export, with the job's hosts as LSF lists them where it does."""
    try:
        hosts = list(dict.fromkeys(lsf_hosts(env)))
    except WorkerEnvError:
        hosts = []
    more = ", ..." if len(hosts) > 4 else ""
    shown = f" LSF lists this job's hosts as {', '.join(hosts[:4])}{more}." if hosts else ""
    return (f"jsrun's variables do not say which host runs rank 0.{shown} Fix: in the job script export "
            "MASTER_ADDR=<the first compute host> (on a CSM cluster the second host of $LSB_MCPU_HOSTS: the first is "
            "the launch node, which runs no task) and MASTER_PORT, which jsrun passes on to its tasks.")


def lsf_hosts(env: Mapping[str, str]) -> list[str]:
    """The job's hosts, one entry per slot, in LSF's order: LSB_DJOB_HOSTFILE's lines, else LSB_MCPU_HOSTS."""
    path = env.get("LSB_DJOB_HOSTFILE", "").strip()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return [line.strip() for line in f if line.strip()]
        except OSError as exc:
            raise WorkerEnvError(f"LSB_DJOB_HOSTFILE={path!r} cannot be read: {exc.strerror}.") from None
    words = env.get("LSB_MCPU_HOSTS", "").split()
    if len(words) % 2 or not all(w.isdecimal() for w in words[1::2]):
        raise WorkerEnvError(f"LSB_MCPU_HOSTS={env.get('LSB_MCPU_HOSTS', '')!r} is not 'host slots host slots ...'.")
    return [host for host, slots in zip(words[::2], words[1::2], strict=True) for _ in range(int(slots))]


class JsrunEnvironment(TaskEnvironment, name="lsf", local_rank_var=_LOCAL_RANK, task_noun="jsrun task",
                       started_by="jsrun"):
    """One jsrun task per rank (`jsrun -n 8 -a 1 -g 1 python train.py`): ranks from JSM_NAMESPACE_*. jsrun's `-g`
    usually gives each resource set its own GPUs already; where a task sees the node's, it takes the one of its local
    rank."""

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return first_set(env, [_RANK]) is not None and first_set(env, [_SIZE]) is not None

    def __init__(self, env: Mapping[str, str]) -> None:
        self._rank, self._world_size, self._local_rank, self._local_world_size = read_ranks(
            env, [_RANK], [_SIZE], [_LOCAL_RANK], [_LOCAL_SIZE], _CONTEXT)
        # An estimate (jsrun's placement may be cyclic): init() asks where the ranks run (cluster/placement.py).
        self._nnodes = -(-self._world_size // self._local_world_size)
        self._node_rank = min(self._rank // self._local_world_size, self._nnodes - 1)
        one_host = self._local_world_size == self._world_size
        self._main_address = store_host(env, one_host, "" if one_host else _address_fix(env))
        self._main_port = store_port(env, lambda: job_port_of(env, ["PMIX_NAMESPACE", "LSB_JOBID"]))

    @property
    def placed_by_hosts(self) -> bool:
        return self._local_world_size < self._world_size

    def fewer_tasks(self, visible_count: int) -> str:
        return "give each task its own GPU (jsrun -a 1 -g 1), or start fewer tasks per host."
