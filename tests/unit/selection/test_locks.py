"""GPU locks: all-or-nothing, holder named, freed by the kernel when the holder dies, safe directories only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.locks import (
    GpusLockedError,
    Holder,
    LockDirError,
    acquire,
    check_lock_dir,
    current_holders,
    lock_dir,
    me,
)

INV = fake_inventory("4")
U = [g.uuid for g in INV.gpus]


def test_lock_release_and_holder(lockdir: Path) -> None:
    holder = Holder("alice", 123, 1_700_000_000.0, "box")
    locks = acquire(U[:2], lockdir, holder)
    assert set(current_holders(U, lockdir)) == set(U[:2])
    with pytest.raises(GpusLockedError) as err:
        acquire([U[1], U[2]], lockdir)
    assert "alice (pid 123, since " in str(err.value)
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


def test_lock_dir_comes_from_the_environment() -> None:
    assert lock_dir({"DDPBOOT_LOCK_DIR": "/srv/locks"}) == Path("/srv/locks")
    assert lock_dir({}) == Path("/tmp/ddpboot-locks")


def test_holder_descriptions() -> None:
    assert Holder("ann", 12).describe() == "ann (pid 12, since ?)"
    mine = me()
    assert mine.pid == os.getpid() and mine.since > 0


def test_a_lock_file_records_no_command_line(lockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["ddpboot", "train.py", "--token", "s3cret"])
    with acquire(U[:1], lockdir):
        record = json.loads((lockdir / f"gpu-{U[0]}.lock").read_text())
    assert set(record) == {"user", "pid", "since", "host"}
    assert "s3cret" not in json.dumps(record)


def test_an_old_lock_file_with_a_command_is_still_read(lockdir: Path) -> None:
    with acquire(U[:1], lockdir):
        old = {"user": "bob", "pid": 77, "command": "ddpboot --token s3cret x.py", "since": 1.0, "host": "h"}
        (lockdir / f"gpu-{U[0]}.lock").write_text(json.dumps(old))
        holder = current_holders(U, lockdir)[U[0]]
    assert holder == Holder("bob", 77, 1.0, "h")
    assert "s3cret" not in holder.describe()


def test_an_unreadable_record_names_an_unknown_holder(lockdir: Path) -> None:
    with acquire(U[:1], lockdir) as locks:
        (lockdir / f"gpu-{U[0]}.lock").write_text("not json")
        assert current_holders(U, lockdir)[U[0]] == Holder()
        assert locks.uuids == (U[0],)
