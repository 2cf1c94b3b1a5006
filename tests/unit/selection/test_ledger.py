"""The GPU health ledger beside the locks: a mark written whole, readable by all, never through a symlink, read back
(a damaged one still counts), cleared; which Xids mean failing; another user can neither overwrite nor clear a mark
in the shared sticky directory."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.ledger import FAILING, clear, failing, failing_gpus, mark, xid_reason
from ddpboot.selection.locks import prepare_lock_dir
from tests.support import as_uid

INV = fake_inventory("3")
U = [g.uuid for g in INV.gpus]


def test_a_mark_is_written_whole_for_every_reader_and_read_back(lockdir: Path) -> None:
    assert failing(U, lockdir) == {}
    assert mark(lockdir, U[1], "Xid 79 (the GPU has fallen off the bus)", "run-7", "1")
    [path] = lockdir.glob("gpu-*.failing")
    assert path.name == f"gpu-{U[1]}.failing" and stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not list(lockdir.glob(".gpu-*"))  # nothing left beside it
    got = failing(U, lockdir)
    assert list(got) == [U[1]]
    m = got[U[1]]
    assert (m.reason, m.run_id, m.label) == ("Xid 79 (the GPU has fallen off the bus)", "run-7", "1")
    assert m.describe() == f"Xid 79 (the GPU has fallen off the bus), seen by job run-7 of {m.user} at {m.when}"
    assert failing_gpus(INV, {"DDPBOOT_LOCK_DIR": str(lockdir)}) == {U[1]: m.describe()}


def test_a_mark_written_again_replaces_the_first(lockdir: Path) -> None:
    assert mark(lockdir, U[0], "first", "run-1")
    assert mark(lockdir, U[0], "second", "run-2")
    assert failing(U, lockdir)[U[0]].reason == "second"


def test_a_damaged_or_unreadable_mark_still_counts(lockdir: Path) -> None:
    (lockdir / f"gpu-{U[0]}.failing").write_text("{not json")
    (lockdir / f"gpu-{U[1]}.failing").write_text(json.dumps({"reason": "x"}))
    (lockdir / f"gpu-{U[2]}.failing").write_bytes(b" " * 5000)  # too big to be one
    assert {u: m.reason for u, m in failing(U, lockdir).items()} == {u: "a damaged mark" for u in U}


def test_a_symlinked_mark_is_never_followed(lockdir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text(json.dumps({"reason": "r", "since": 1.0, "run_id": "j", "user": "u", "host": "h"}))
    (lockdir / f"gpu-{U[0]}.failing").symlink_to(target)
    assert failing(U, lockdir)[U[0]].reason == "a mark that cannot be read"  # out, but not read through the link
    assert mark(lockdir, U[0], "Xid 79", "run-1")  # the link itself is replaced, the target left alone
    assert not (lockdir / f"gpu-{U[0]}.failing").is_symlink() and json.loads(target.read_text())["reason"] == "r"


def test_clearing_removes_the_mark_and_says_what_it_was(lockdir: Path) -> None:
    assert clear(lockdir, U[0]) is None
    mark(lockdir, U[0], "Xid 48 (a double-bit ECC error)", "run-3")
    was = clear(lockdir, U[0])
    assert was is not None and was.run_id == "run-3"
    assert failing(U, lockdir) == {} and clear(lockdir, U[0]) is None


def test_no_directory_no_mark_and_a_directory_that_refuses_is_no_error(tmp_path: Path) -> None:
    assert failing(U, tmp_path / "none") == {}
    assert not mark(tmp_path / "none", U[0], "Xid 79", "run-1")


@pytest.mark.parametrize(("xid", "failing_"), [(48, True), (79, True), (94, True), (95, True), (13, False),
                                               (31, False), (43, False), (0, False)])
def test_only_the_xids_of_a_failing_gpu_mark_it(xid: int, failing_: bool) -> None:
    assert (xid_reason(xid) is not None) == failing_
    if failing_:
        assert xid_reason(xid) == f"Xid {xid} ({FAILING[xid]})"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A lock directory every user can reach (pytest's tmp_path is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="ddpboot-ledger-"))
    os.chmod(base, 0o755)
    yield prepare_lock_dir(base / "locks")
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_can_neither_overwrite_nor_clear_a_mark(shared: Path) -> None:
    mark(shared, U[0], "Xid 79 (the GPU has fallen off the bus)", "run-root")

    def stranger() -> list[str]:
        outcomes = ["wrote" if mark(shared, U[0], "nothing wrong", "run-x") else "refused"]
        try:
            clear(shared, U[0])
            outcomes.append("cleared")
        except PermissionError:
            outcomes.append("denied")
        outcomes.append("marked" if mark(shared, U[1], "Xid 95", "run-x") else "refused")
        outcomes.append("cleared own" if clear(shared, U[1]) else "none")
        return outcomes

    assert as_uid(65534, stranger) == ["refused", "denied", "marked", "cleared own"]
    assert failing(U, shared)[U[0]].run_id == "run-root"
