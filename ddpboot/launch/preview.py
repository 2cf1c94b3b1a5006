"""A job as it would run, shown without starting it: the plan as JSON (`ddpboot plan --json`, and a run directory's
plan.json) and what each rank would run (`--dry-run`: its command line, CPUs and the variables ddpboot sets for it,
as the first attempt would get them; the port and the run directory, known only at launch, as placeholders). The
runner builds a DryRun once (launch/runner.py `dry_run`); the command line prints it as text or JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpboot.launch.rundir import RunPaths
from ddpboot.launch.spec import LaunchSpec
from ddpboot.selection.planner import Plan

PORT_AT_LAUNCH = "<port bound at launch>"  # MASTER_PORT where the launcher binds a free port only when it starts


def plan_json(plan: Plan) -> dict[str, object]:
    """The plan as `ddpboot plan --json` prints it (docs/reference.md), the node setup included."""
    data = plan.to_json()
    data.setdefault("cluster", plan.cluster)
    return data


@dataclass(frozen=True)
class DryRunWorker:
    """What one rank would run: its command line, CPU affinity, memory's NUMA nodes and the variables ddpboot sets
    for it."""

    rank: int
    local_rank: int
    argv: list[str]
    cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    variables: dict[str, str]


@dataclass(frozen=True)
class DryRun:
    """`--dry-run`: the plan, what the supervisor would run, and each worker; `notes`, what the launcher would say
    first."""

    plan: Plan
    spec: LaunchSpec
    workers: list[DryRunWorker]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        """`--dry-run --json`: the plan (as `ddpboot plan --json`), the store, and each worker."""
        spec = self.spec
        return {
            "plan": plan_json(self.plan),
            "run_id": spec.run_id,
            "store": {"backend": spec.store, "bind_addr": spec.bind_addr, "master_addr": spec.master_addr,
                      "port": spec.master_port},
            "notes": list(self.notes),
            "workers": [{"rank": w.rank, "local_rank": w.local_rank, "argv": w.argv, "cpus": list(w.cpus),
                         "env": w.variables} for w in self.workers],
        }


def dry_run_workers(plan: Plan, spec: LaunchSpec, env: Mapping[str, str]) -> list[DryRunWorker]:
    """Each rank's command and variables as the first attempt would get them."""
    from ddpboot.launch.env import EnvContext, worker_argv, worker_vars

    port = spec.master_port or 0
    ctx = EnvContext(spec.master_addr, port, spec.run_id, spec.role, 0, spec.max_restarts,
                     ",".join(s.name for s in spec.signals))
    out = []
    for slot in plan.ranks:
        own = worker_vars(plan, slot, ctx, env, str(RunPaths(Path("<log dir>")).attempt(0).error_file(slot.rank)))
        if not port:
            own["MASTER_PORT"] = PORT_AT_LAUNCH
        out.append(DryRunWorker(slot.rank, slot.local_rank, worker_argv(spec.target, spec.python, slot.local_rank),
                                tuple(slot.cpus), tuple(slot.mem_nodes), own))
    return out
