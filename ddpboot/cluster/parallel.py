"""Signs of a parallel launch that no environment ddpboot knows describes: a process that looks like one task of
several, started by a launcher whose variables do not say all ddpboot needs (the world's size, this task's place,
where rank 0 runs). Running on as a world of one would silently train one model per task, so `ddpboot.init()`
(cluster/local.py) and the launcher (nodes/static.py) stop instead, naming the variables.

A sign is a size above 1 or a task number above the first:

- PMI_SIZE / PMI_RANK (PMI-1 and PMI-2: Flux, an MPI launcher that gives no local rank) and PMIX_RANK (a PMIx
  launcher, whose sizes live in its server, not in the environment);
- the rank and size of an MPI launcher that gives less than all four of its variables (cluster/mpi.py FLAVOURS);
- PBS_TASKNUM above 1 without PBS_VNODENUM: a task that OpenPBS's or PBS Professional's pbsdsh (tm_spawn) started
  (their task ids are hexadecimal; Torque's pbsdsh adds PBS_VNODENUM, cluster/pbs.py);
- LSF_PM_TASKID above 1: a task LSF's blaunch started (numbered from 1);
- FLUX_TASK_RANK above 0 or FLUX_JOB_SIZE above 1: Flux's own task variables.

The first task of a launcher that gives no size (PMIX_RANK=0, LSF_PM_TASKID=1) shows no sign: it may well be
alone. Its siblings stop, so the job does not run on in silence.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddpboot.cluster.mpi import FLAVOURS

PMI = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK")


def _number(text: str, base: int = 10) -> int | None:
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def _above(env: Mapping[str, str], name: str, limit: int, base: int = 10) -> str | None:
    value = env.get(name, "").strip()
    n = _number(value, base) if value else None
    return f"{name}={value}" if n is not None and n > limit else None


def parallel_signs(env: Mapping[str, str]) -> list[str]:
    """`NAME=VALUE` of each variable that shows a parallel launch (the module docstring's list), in that order."""
    checks: list[tuple[str, int, int]] = [("PMI_SIZE", 1, 10), ("PMI_RANK", 0, 10), ("PMIX_RANK", 0, 10)]
    for flavour in FLAVOURS:
        checks += [(name, 1, 10) for name in flavour.size] + [(name, 0, 10) for name in flavour.rank]
    checks += [("LSF_PM_TASKID", 1, 10), ("FLUX_TASK_RANK", 0, 10), ("FLUX_JOB_SIZE", 1, 10)]
    signs = list(dict.fromkeys(s for name, limit, base in checks if (s := _above(env, name, limit, base))))
    if env.get("PBS_JOBID", "").strip() and not env.get("PBS_VNODENUM", "").strip():
        task = env.get("PBS_TASKNUM", "").strip()
        n = _number(task, 16 if len(task) == 8 else 10) if task else None  # OpenPBS writes spawned tasks as %8.8X
        if n is not None and n > 1:
            signs.append(f"PBS_TASKNUM={task}")
    return signs


def launcher_hint(signs: list[str]) -> str:
    """Who probably set the variables, for the message."""
    names = " ".join(signs)
    if "PBS_TASKNUM" in names:
        return "a task of OpenPBS's or PBS Professional's pbsdsh, which gives no node file line (PBS_VNODENUM)"
    if "LSF_PM_TASKID" in names:
        return "a task of LSF's blaunch, which gives no size"
    if "FLUX_" in names:
        return "a task of Flux"
    if "PMIX_RANK" in names and "PMI_" not in names.replace("PMIX_", ""):
        return "a task of a PMIx launcher, which keeps the sizes in its server"
    if any(s.startswith("PMI_") for s in signs):
        return "a task of a PMI launcher (Flux, or an MPI launcher) that gives no node-local rank"
    return "a task of an MPI launcher whose variables are incomplete"


def unknown_launch(env: Mapping[str, str], who: str) -> str | None:
    """The message for `who` (this process, this launcher) when the environment shows a parallel launch that no
    known environment describes; None when it shows none. The caller adds what to do in its case."""
    signs = parallel_signs(env)
    if not signs:
        return None
    return (f"{', '.join(signs)} say {who} is one of several tasks ({launcher_hint(signs)}), but not all that "
            "ddpboot needs to place it among them: running on as a world of one would train one model per task")
