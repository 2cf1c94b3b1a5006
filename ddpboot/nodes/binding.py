"""The CPUs of a launcher an MPI launcher started: MPI binds each process it starts, and a ddpboot launcher that
should have the whole node would otherwise keep its ranks inside that binding.

Open MPI binds every process to a core when it starts two or fewer, to a socket above that (`--bind-to` changes
it); Intel MPI pins too (I_MPI_PIN); MVAPICH binds by default (MV2_ENABLE_AFFINITY). With the documented
`mpirun -np N --map-by ppr:1:node ddpboot ...` the launcher then sees one core, every rank it plans gets that core,
and `plan` shows `cores 0` for each. So, when the launcher's CPUs are fewer than its ranks (one core each at least):

- it is the only MPI process of its host (local size 1): it widens to every CPU its cgroup allows (the binding is
  only an affinity mask, which any process may widen within its cpuset) and says so;
- otherwise (several launchers per host share it) or where nothing wider is allowed: it keeps the binding and says
  which flag starts it unbound.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ddpboot.cluster.base import first_set
from ddpboot.cluster.mpi import Flavour, mpi_flavour
from ddpboot.procfs import cgroups
from ddpboot.selection.affinity import format_cpu_list, parse_cpu_list
from ddpboot.selection.planner import Plan

BINDING_NOTE = "the MPI launcher bound"  # how every note of launcher_cpus begins
UNBOUND = {
    "Open MPI": "mpirun --bind-to none",
    "MVAPICH": "MV2_ENABLE_AFFINITY=0",
    "Cray PALS": "mpiexec --cpu-bind none",
    "MPICH/Intel MPI (Hydra)": "mpiexec -bind-to none (MPICH), I_MPI_PIN=0 (Intel MPI)",
}


@dataclass(frozen=True)
class Cpus:
    """The CPUs the launcher plans its ranks on, and what it says about them (None: nothing to say)."""

    cpus: tuple[int, ...]
    note: str | None = None


def launcher_cpus(env: Mapping[str, str], mask: Sequence[int], allowed: Sequence[int] | None, ranks: int) -> Cpus:
    """The CPUs for `ranks` ranks of a launcher whose affinity is `mask` and whose cgroup allows `allowed` (None:
    unknown): the module docstring's rule. Pure."""
    own = tuple(sorted(mask))
    flavour = mpi_flavour(env)
    if flavour is None or len(own) >= ranks:
        return Cpus(own)
    wider = tuple(sorted(set(allowed or ()) | set(own)))
    local = first_set(env, flavour.local_size)
    alone = local is not None and local[1] == "1"
    fix = UNBOUND.get(flavour.name, "start it without a CPU binding")
    bound = f"{BINDING_NOTE} this ddpboot ({flavour.name}) to CPU{_s(own)} {format_cpu_list(own)}, fewer than its " \
            f"{ranks} ranks (one core each)"
    if alone and len(wider) > len(own):
        return Cpus(wider, f"{bound}: they run on CPUs {format_cpu_list(wider)}, all that this host allows it ({fix} "
                           "starts it unbound)")
    why = "other ddpboot launchers of this job share this host" if not alone else "this host allows it no other CPUs"
    shared = "it" if len(own) == 1 else "them"
    return Cpus(own, f"{bound}, and {why}: every rank shares {shared}. Start ddpboot unbound: {fix}"
                     f"{_flavour_note(flavour)}")


def _s(cpus: Sequence[int]) -> str:
    return "s" if len(cpus) != 1 else ""


def _flavour_note(flavour: Flavour) -> str:
    if flavour.name != "Open MPI":
        return ""
    return " (Open MPI binds to a core for 2 processes or fewer, to a socket above)"


def cgroup_cpus(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> list[int] | None:
    """The CPUs this process's cgroup allows (cgroup v2 `cpuset.cpus.effective`, or v1's cpuset), or None where
    none can be read."""
    found = cgroups("self", Path(proc))
    if found is None:
        return None
    for controllers, path in found:
        rel = path.lstrip("/")
        if controllers == "":  # v2: walk up to the nearest cgroup that lists them
            candidates = [Path(cgroup_root, rel, "cpuset.cpus.effective"), Path(cgroup_root, "cpuset.cpus.effective")]
        elif "cpuset" in controllers.split(","):
            candidates = [Path(cgroup_root, "cpuset", rel, "cpuset.effective_cpus"),
                          Path(cgroup_root, "cpuset", "cpuset.effective_cpus")]
        else:
            continue
        for candidate in candidates:
            try:
                text = candidate.read_text().strip()
            except OSError:
                continue
            if text:
                return sorted(parse_cpu_list(text, "the cgroup's cpuset"))
    return None


def on_launcher_cpus(make: Callable[[Sequence[int]], Plan], env: Mapping[str, str]) -> Plan:
    """`make(cpus)`'s plan on the launcher's CPUs, widened where an MPI binding leaves its ranks fewer cores than
    they are (nodes/binding.py), with the note that says so."""
    mask = sorted(os.sched_getaffinity(0))
    plan = make(mask)
    if mpi_flavour(env) is None:
        return plan
    cpus = launcher_cpus(env, mask, cgroup_cpus(), len(plan.ranks))
    if cpus.note is None:
        return plan
    wider = make(cpus.cpus) if cpus.cpus != tuple(mask) else plan
    return replace(wider, notes=(*wider.notes, cpus.note))
