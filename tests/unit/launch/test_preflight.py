"""Checks before anything starts (ddpboot/launch/preflight.py): the program exists and can run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.preflight import RANKS_PER_CORE, check_rank_count, check_target, is_module_name
from ddpboot.launch.spec import Target

PY = sys.executable


def check(kind: str, name: str, cwd: Path, env: dict[str, str] | None = None) -> Target:
    return check_target(Target(kind, name), PY, env if env is not None else {"PATH": os.defpath}, cwd)  # type: ignore[arg-type]


def test_scripts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "other.py").write_text("")
    assert check("script", "train.py", tmp_path) == Target("script", "train.py")
    with pytest.raises(UsageError, match=r"the script 'tain.py' does not exist .* Python files there: other.py, "
                                         "train.py"):
        check("script", "tain.py", tmp_path)
    with pytest.raises(UsageError, match=r"the script 'nope.py' \(--run-path\) does not exist"):
        check("run_path", "nope.py", tmp_path)
    (tmp_path / "pkg").mkdir()
    with pytest.raises(UsageError, match=r"is a directory without __main__\.py"):
        check("script", "pkg", tmp_path)
    (tmp_path / "pkg" / "__main__.py").write_text("")
    assert check("script", "pkg", tmp_path).name == "pkg"


def test_modules(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('never imported by the check')")
    (tmp_path / "mypkg" / "train.py").write_text("")
    assert check("module", "mypkg.train", tmp_path).name == "mypkg.train"
    assert check("module", "json.tool", tmp_path).name == "json.tool"
    for name, message in (
        ("train.py", "that is a file name, not a module name"),
        ("my-pkg", "is not a module name"),
        ("nosuchmod", "no module named 'nosuchmod'"),
        ("mypkg.nope", "package 'mypkg' .* has no module 'nope'"),
        ("mypkg.train.deeper", "is a module, not a package"),
        ("mypkg", "is a package without __main__.py"),
    ):
        with pytest.raises(UsageError, match=message):
            check("module", name, tmp_path)


def test_binaries(tmp_path: Path) -> None:
    assert check("binary", "sh", tmp_path).name.endswith("/sh")  # found on PATH, made absolute
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    with pytest.raises(UsageError, match="is not executable"):
        check("binary", "./tool", tmp_path)
    (tmp_path / "tool").chmod(0o755)
    assert check("binary", "./tool", tmp_path).name == str(tmp_path / "tool")
    with pytest.raises(UsageError, match="no program 'no-such-program-here' on PATH"):
        check("binary", "no-such-program-here", tmp_path)
    with pytest.raises(UsageError, match=r"the program '\./gone' does not exist"):
        check("binary", "./gone", tmp_path)


def test_module_names() -> None:
    assert is_module_name("pkg.train") and is_module_name("numpy")
    assert not is_module_name("pkg-train") and not is_module_name("pkg..train") and not is_module_name("")


def test_an_empty_script_name_is_named_as_empty(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^the script name is empty"):
        check("script", "", tmp_path)


def test_rank_counts_that_cannot_work_are_refused_with_the_numbers() -> None:
    cores = len(os.sched_getaffinity(0))
    check_rank_count(RANKS_PER_CORE * cores, oversubscribe=False)
    with pytest.raises(UsageError, match=rf"on {cores} usable CPU core.*--oversubscribe"):
        check_rank_count(RANKS_PER_CORE * cores + 1, oversubscribe=False)
    check_rank_count(RANKS_PER_CORE * cores + 1, oversubscribe=True)


def test_the_process_and_file_limits_hold_even_oversubscribed(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    limits = {resource.RLIMIT_NPROC: (500, 500), resource.RLIMIT_NOFILE: (1024, 1024)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits[which])
    with pytest.raises(UsageError, match=r"--nproc 500: .*process limit \(ulimit -u, RLIMIT_NPROC\) is 500"):
        check_rank_count(500, oversubscribe=True)
    with pytest.raises(UsageError, match=r"open-file limit \(ulimit -n, RLIMIT_NOFILE\) is 1024. Ask for at most 240"):
        check_rank_count(300, oversubscribe=True)
