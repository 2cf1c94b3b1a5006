"""GPU locks: all-or-nothing, holder named, freed by the kernel when the holder dies, safe directories only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.errors import PlanError, UsageError
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.locks import (
    GpusLockedError,
    Holder,
    LockDirError,
    acquire,
    check_lock_dir,
    current_holders,
    prepare_lock_dir,
)
from ddpboot.selection.planner import Request, make_plan
from ddpboot.selection.reserve import parse_wait, reserve

INV = fake_inventory("4")
U = [g.uuid for g in INV.gpus]


@pytest.fixture
def lockdir(tmp_path: Path) -> Path:
    d = tmp_path / "locks"
    return prepare_lock_dir(d)


def test_lock_release_and_holder(lockdir: Path) -> None:
    holder = Holder("alice", 123, "ddpboot train.py", 1_700_000_000.0, "box")
    locks = acquire(U[:2], lockdir, holder)
    assert set(current_holders(U, lockdir)) == set(U[:2])
    with pytest.raises(GpusLockedError) as err:
        acquire([U[1], U[2]], lockdir)
    assert "alice (pid 123, `ddpboot train.py`" in str(err.value)
    assert set(err.value.holders) == {U[1]}
    assert current_holders(U, lockdir).keys() == {U[0], U[1]}  # all or nothing: U[2] was not kept
    locks.release()
    assert current_holders(U, lockdir) == {}
    with acquire(U, lockdir) as all4:
        assert sorted(all4.uuids) == sorted(U)


def test_directory_is_shared_and_sticky(lockdir: Path) -> None:
    assert (lockdir.stat().st_mode & 0o7777) == 0o1777


def test_lock_fds_are_not_inherited(lockdir: Path) -> None:
    with acquire(U[:1], lockdir) as locks:
        assert all(not os.get_inheritable(fd) for fd in locks.fds.values())


HOLD = """
import sys
from pathlib import Path
from ddpboot.selection.locks import acquire
locks = acquire(sys.argv[2:], Path(sys.argv[1]))
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_killed_holder_frees_its_gpus_at_once(lockdir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lockdir), U[0], U[3]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        held = current_holders(U, lockdir)
        assert set(held) == {U[0], U[3]} and held[U[0]].pid == proc.pid
        proc.kill()
        proc.wait(timeout=10)
        with acquire([U[0], U[3]], lockdir):  # no wait needed: the kernel dropped the flock with the process
            pass
    finally:
        proc.kill()
        proc.wait()


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(LockDirError, match="symbolic link"):
        check_lock_dir(link)


def test_world_writable_without_sticky_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(LockDirError, match="sticky"):
        check_lock_dir(d)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_directory_of_another_user(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir()
    os.chown(d, 65534, 65534)
    d.chmod(0o755)
    with pytest.raises(LockDirError, match="belongs to another user"):
        check_lock_dir(d)
    d.chmod(0o1777)  # a shared sticky directory, like /tmp, is fine
    check_lock_dir(d)


def test_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(LockDirError, match="not a directory"):
        check_lock_dir(f)


# --- planning around locks and reserving -----------------------------------------------------------


def plan_with(req: Request):  # type: ignore[no-untyped-def]
    return lambda inv, locked: make_plan(req, inv, {}, allowed_cpus=[0], locked=locked)


def test_automatic_choice_skips_locked_gpus(lockdir: Path) -> None:
    first, l1 = reserve(lambda: INV, plan_with(Request(nproc="2")), lockdir)
    second, l2 = reserve(lambda: INV, plan_with(Request(nproc="2")), lockdir)
    got1 = [g.index for r in first.ranks for g in r.gpus]
    got2 = [g.index for r in second.ranks for g in r.gpus]
    assert got1 == [0, 1] and got2 == [2, 3]
    with pytest.raises(PlanError, match="locked by"):
        reserve(lambda: INV, plan_with(Request(nproc="1")), lockdir)
    assert l1 and l2
    l1.release()
    l2.release()


def test_explicit_gpu_that_is_locked_names_the_holder_unless_shared(lockdir: Path) -> None:
    held = acquire([U[2]], lockdir, Holder("bob", 77, "ddpboot big.py", 1.0))
    with pytest.raises(PlanError, match=r"GPU 2 is locked by another ddpboot job: bob \(pid 77"):
        reserve(lambda: INV, plan_with(Request(gpus="2")), lockdir)
    plan, locks = reserve(lambda: INV, plan_with(Request(gpus="2,3", share=True)), lockdir, share=True)
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
        plan_with(Request(nproc="3")),
        lockdir,
        wait=60,
        progress=said.append,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert len(plan.ranks) == 3 and locks is not None
    assert said and said[0].startswith("waiting for GPUs:") and "locked by" in said[0]
    locks.release()


def test_waiting_gives_up_at_the_deadline(lockdir: Path) -> None:
    blocker = acquire(U, lockdir)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(PlanError, match="need 1 free GPU"):
        reserve(lambda: INV, plan_with(Request(nproc="1")), lockdir, wait=5, clock=lambda: now[0], sleep=sleep)
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
