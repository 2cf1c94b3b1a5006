"""Choose GPUs around the ones other ddpboot jobs hold, then lock the choice; optionally wait until it can be had.

Two launchers started at the same instant may plan the same free GPUs; `acquire` lets exactly one of them lock
them (all or nothing), and the other plans again around the locks it now sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ddpboot.selection.gpu import Inventory
from ddpboot.selection.locks import GpuLocks, GpusLockedError, acquire, current_holders, prepare_lock_dir
from ddpboot.selection.planner import GpusBusy, Plan
from ddpboot.units import parse_duration

PlanWith = Callable[[Inventory, Mapping[str, str]], Plan]


def parse_wait(text: str | None) -> float | None:
    """`--wait-for-gpus`: seconds, or with a unit (90s, 10m, 2h), or `inf`; None when not given."""
    if text is None:
        return None
    return parse_duration(text, "--wait-for-gpus", allow_zero=False, allow_inf=True)


def reserve(
    load: Callable[[], Inventory],
    plan_with: PlanWith,
    directory: Path,
    wait: float | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    share: bool = False,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Plan, GpuLocks | None]:
    """The plan and the locks on its GPUs. Without `wait`, a plan that cannot be had now raises at once; with it,
    only a plan that waits on busy or locked GPUs (GpusBusy) is tried again until the deadline."""
    prepare_lock_dir(directory)
    deadline = None if wait is None else clock() + wait
    last_reason = ""
    while True:
        inventory = load()
        uuids = [u.uuid for u in inventory.units()]
        holders = current_holders(uuids, directory)
        try:
            plan = plan_with(inventory, {u: h.describe() for u, h in holders.items()})
        except GpusBusy as exc:  # any other PlanError is raised at once: no wait makes it possible
            if deadline is None or clock() >= deadline:
                raise
            reason = str(exc)
            if reason != last_reason:
                how_long = "" if wait == float("inf") else f" for up to {wait:g} s"
                progress(f"waiting for GPUs{how_long} (Ctrl-C (SIGINT) or SIGTERM ends the wait): {reason}")
                last_reason = reason
            sleep(min(poll, max(deadline - clock(), 0.0)))
            continue
        wanted = [g.uuid for slot in plan.ranks for g in slot.gpus]
        if share:
            wanted = [u for u in wanted if u not in holders]
        if not wanted:
            return plan, None
        try:
            return plan, acquire(wanted, directory)
        except GpusLockedError:
            continue  # another job locked some of them between our look and our lock: plan again around it
