"""Checks before anything starts (ddpboot/launch/preflight.py): the program exists and can run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.preflight import check_target, is_module_name
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
