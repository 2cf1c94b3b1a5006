"""Reserving GPUs: plan around the GPUs other jobs hold, lock the choice all or nothing, wait for GPUs on request."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from ddpboot.errors import PlanError, UsageError
from ddpboot.selection.gpu import Inventory
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.locks import GpuLocks, Holder, acquire
from ddpboot.selection.planner import GpusBusy, Plan, make_plan
from ddpboot.selection.request import Request, parse_request
from ddpboot.selection.reserve import PlanWith, parse_wait, reserve

INV = fake_inventory("4")
U = [g.uuid for g in INV.gpus]


def plan_with(req: Request) -> PlanWith:
    def plan(inv: Inventory, locked: Mapping[str, str]) -> Plan:
        return make_plan(req, inv, {}, allowed_cpus=[0], locked=locked)

    return plan


def test_automatic_choice_skips_locked_gpus(lockdir: Path) -> None:
    first, l1 = reserve(lambda: INV, plan_with(parse_request(nproc="2")), lockdir)
    second, l2 = reserve(lambda: INV, plan_with(parse_request(nproc="2")), lockdir)
    got1 = [g.index for r in first.ranks for g in r.gpus]
    got2 = [g.index for r in second.ranks for g in r.gpus]
    assert got1 == [0, 1] and got2 == [2, 3]
    with pytest.raises(PlanError, match="locked by"):
        reserve(lambda: INV, plan_with(parse_request(nproc="1")), lockdir)
    assert l1 and l2
    l1.release()
    l2.release()


def test_explicit_gpu_that_is_locked_names_the_holder_unless_shared(lockdir: Path) -> None:
    held = acquire([U[2]], lockdir, Holder("bob", 77, 1.0))
    with pytest.raises(PlanError, match=r"GPU 2 is locked by another ddpboot job: bob \(pid 77"):
        reserve(lambda: INV, plan_with(parse_request(gpus="2")), lockdir)
    plan, locks = reserve(lambda: INV, plan_with(parse_request(gpus="2,3", share=True)), lockdir, share=True)
    assert [r.gpus[0].index for r in plan.ranks] == [2, 3]
    assert locks is not None and locks.uuids == (U[3],)  # the shared GPU's lock stays with its holder
    locks.release()
    held.release()


def test_waiting_starts_when_gpus_are_released(lockdir: Path) -> None:
    blocker = acquire(U, lockdir)
    said: list[str] = []
    now = [0.0]

    def sleep(s: float) -> None:  # the clock the reservation reads; the blocker ends after the first wait
        now[0] += s
        blocker.release()

    plan, locks = reserve(
        lambda: INV,
        plan_with(parse_request(nproc="3")),
        lockdir,
        wait=60,
        progress=said.append,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert len(plan.ranks) == 3 and locks is not None
    assert said and said[0].startswith("waiting for GPUs for up to ") and "locked by" in said[0]
    locks.release()


def test_waiting_gives_up_at_the_deadline(lockdir: Path) -> None:
    blocker = acquire(U, lockdir)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(PlanError, match="need 1 free GPU"):
        reserve(lambda: INV, plan_with(parse_request(nproc="1")), lockdir, wait=5, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 5
    blocker.release()


@pytest.mark.parametrize(
    ("text", "value"),
    [("600", 600.0), ("90s", 90.0), ("10m", 600.0), ("2h", 7200.0), ("inf", float("inf")), (None, None)],
)
def test_parse_wait(text: str | None, value: float | None) -> None:
    assert parse_wait(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "soon", "", "0m"])
def test_parse_wait_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="wait-for-gpus"):
        parse_wait(text)


def test_a_plan_without_gpus_takes_no_locks(lockdir: Path) -> None:
    plan, locks = reserve(lambda: INV, plan_with(parse_request(cpu=True)), lockdir)
    assert plan.backend == "gloo" and locks is None


def test_losing_a_race_plans_again_around_the_winner(lockdir: Path) -> None:
    """Another job locks the planned GPUs between our look and our lock: the next round plans around them."""
    rival: list[GpuLocks] = []
    seen: list[list[str]] = []

    def plan(inv: Inventory, locked: Mapping[str, str]) -> Plan:
        seen.append(sorted(locked))
        chosen = make_plan(parse_request(nproc="2"), inv, {}, allowed_cpus=[0], locked=locked)
        if not rival:  # the other job takes what we just chose, before we lock it
            rival.append(acquire([g.uuid for r in chosen.ranks for g in r.gpus], lockdir, Holder("rival", 9)))
        return chosen

    got, locks = reserve(lambda: INV, plan, lockdir)
    assert seen == [[], sorted(U[:2])] and [r.gpus[0].index for r in got.ranks] == [2, 3]
    assert locks is not None and set(locks.uuids) == set(U[2:])
    locks.release()
    rival[0].release()


def test_waiting_never_starts_for_what_the_machine_cannot_give(lockdir: Path) -> None:
    slept: list[float] = []
    for impossible in (parse_request(nproc="5"), parse_request(gpus="7")):  # 4 GPUs here
        with pytest.raises(PlanError) as refused:
            reserve(lambda: INV, plan_with(impossible), lockdir, wait=float("inf"), sleep=slept.append)
        assert not isinstance(refused.value, GpusBusy)
    assert not slept
