"""Why a path cannot be used (ddpboot/launch/paths.py), on real files: a loop of symbolic links, a link to a missing
file, a directory the user may not search (a child dropped to uid 65534), a deleted current directory, and a
temporary directory too deep for multiprocessing's sockets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.paths import (
    AF_UNIX_PATH_MAX,
    MP_SOCKET_DEPTH,
    current_directory,
    link_chain,
    temp_dir_note,
    unsearchable,
    why_unusable,
)
from tests.support import as_uid


def test_a_loop_of_links_is_named_as_a_loop(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert link_chain(tmp_path / "a") == [str(tmp_path / "a"), "b", "a"]
    said = why_unusable(tmp_path / "a") or ""
    assert said.startswith(f"is a loop of symbolic links ({tmp_path / 'a'} -> b -> a), which leads to no file")
    (tmp_path / "self").symlink_to("self")
    assert (why_unusable(tmp_path / "self") or "").startswith("is a loop of symbolic links")


def test_missing_files_and_links_to_them(tmp_path: Path) -> None:
    (tmp_path / "there.py").write_text("")
    (tmp_path / "dangling").symlink_to("nowhere.py")
    (tmp_path / "file").write_text("")
    assert why_unusable(tmp_path / "there.py") is None
    assert why_unusable(tmp_path / "missing.py") == "does not exist"
    assert (why_unusable(tmp_path / "dangling") or "").startswith(
        f"is a symbolic link to a missing file ({tmp_path / 'dangling'} -> nowhere.py)")
    assert (why_unusable(tmp_path / "file" / "x.py") or "").startswith("does not exist: a part of its path is a file")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a child drops to uid 65534")
def test_a_directory_the_user_may_not_search_is_named(tmp_path: Path) -> None:
    top = Path(os.environ.get("TMPDIR", "/tmp")) / f"ddpboot-paths-{os.getpid()}"
    closed = top / "closed"
    closed.mkdir(parents=True)
    try:
        (closed / "train.py").write_text("")
        top.chmod(0o755)
        closed.chmod(0o700)
        said = as_uid(65534, lambda: [why_unusable(closed / "train.py") or "", str(unsearchable(closed / "x"))])
    finally:
        closed.chmod(0o700)
        (closed / "train.py").unlink()
        closed.rmdir()
        top.rmdir()
    assert said[0].startswith(f"cannot be reached: you may not search the directory {closed} (its mode is "
                              "drwx------, owner root)"), said
    assert said[1] == str(closed)
    assert why_unusable(top / "gone") == "does not exist"  # root may search anything


def test_a_deleted_current_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        with pytest.raises(UsageError) as caught:
            current_directory()
    finally:
        os.chdir(here)
    assert str(caught.value).startswith(f"the current directory {gone} no longer exists: it was deleted or moved")
    assert f"(e.g. `cd {tmp_path}`)" in str(caught.value)
    assert current_directory() == Path(here)


def test_the_temporary_directory_is_measured_as_multiprocessing_uses_it() -> None:
    """multiprocessing's listener lies MP_SOCKET_DEPTH bytes below the first of TMPDIR, TEMP, TMP that is set."""
    limit = "/" + "t" * (AF_UNIX_PATH_MAX - MP_SOCKET_DEPTH - 1)  # a socket path of exactly AF_UNIX_PATH_MAX
    assert temp_dir_note({"TMPDIR": limit}) is None and temp_dir_note({"TMPDIR": limit + "/"}) is None
    assert temp_dir_note({"TMPDIR": limit + "x"}) is not None
    assert temp_dir_note({"TMPDIR": "/tmp", "TEMP": limit + "x"}) is None  # tempfile takes TMPDIR first
    assert (temp_dir_note({"TEMP": limit + "x"}) or "").startswith("TEMP=")
    assert temp_dir_note({}) is None and temp_dir_note({"TMPDIR": "relative/" + "x" * 200}) is None
    assert temp_dir_note({"TMPDIR": "/" + "é" * 38}) is not None  # bytes, not characters: 77 bytes
