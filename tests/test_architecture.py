"""The shape of the code, checked like behaviour: the layers (import-linter's contracts in pyproject.toml), the
complexity and size limits, no dead code, and a repository that stands alone (docs/architecture.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "ddpboot"
MAX_MODULE_LINES = 400


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]' brings it)")
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_imports_point_down_the_layers() -> None:
    res = _run(_tool("lint-imports"), "--no-cache")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_no_function_is_too_complex() -> None:
    res = _run(_tool("ruff"), "check", "--select", "C90", "--output-format", "concise", "ddpboot")
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_dead_code() -> None:
    res = _run(_tool("vulture"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_modules_stay_small() -> None:
    big = {
        str(p.relative_to(REPO)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them into a package of small modules): {big}"


def test_the_repository_cites_only_its_own_files() -> None:
    """Code, docs and tests cite files of this repository only: what the code relies on is written down here."""
    outside = re.compile(r"\b(DESIGN|FACTS)\.md\b")
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for top in ("ddpboot", "docs", "tests", "benchmarks", "examples", "scripts")
        for p in (REPO / top).rglob("*")
        if p.is_file() and p.suffix in (".py", ".md", ".sh", ".toml", "") and p != Path(__file__)
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ] + [f"README.md:{i}" for i, line in enumerate((REPO / "README.md").read_text().splitlines(), 1)
         if outside.search(line)]
    assert not hits, f"references to files that are not in the repository: {hits}"


def _unit_mirror(module: Path) -> Path:
    rel = module.relative_to(PACKAGE)
    return REPO / "tests" / "unit" / rel.parent / f"test_{rel.stem}.py"


def test_every_module_has_a_unit_test_mirror_or_is_listed_as_process_tested() -> None:
    """docs/architecture.md lists the modules tested only with real processes; every other has its unit mirror."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    listed_block = doc.split("<!-- modules-without-unit-mirror -->", 1)[1].split("<!-- end -->", 1)[0]
    listed = set(re.findall(r"`([a-z_/]+\.py)`", listed_block))
    modules = [p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    unlisted = sorted(str(p.relative_to(PACKAGE)) for p in modules
                      if not _unit_mirror(p).exists() and str(p.relative_to(PACKAGE)) not in listed)
    assert not unlisted, f"no tests/unit mirror and not in docs/architecture.md's list: {unlisted}"
    stale = sorted(m for m in listed if _unit_mirror(PACKAGE / m).exists() or not (PACKAGE / m).exists())
    assert not stale, f"listed in docs/architecture.md as without a unit mirror, but it has one or is gone: {stale}"


def test_tests_import_no_private_name_and_no_other_test_module() -> None:
    private = re.compile(r"^\s*from ddpboot[\w.]* import [^#\n]*\b_[a-z]\w*", re.M)
    # a test module (test_*.py) imported by another: `from tests.x import test_y` or `from tests.x.test_y import ...`
    suite = re.compile(r"^\s*(?:from tests[\w.]* import [^#\n]*\btest_\w+|(?:from|import) tests[\w.]*\.test_\w+).*$",
                       re.M)
    # The launcher's own supervision tests, rerun with ranks forked by a fast-start or warm process.
    allowed = {"tests/process/test_fast_start.py": "from tests.process import test_launcher as launcher",
               "tests/process/test_warm.py": "from tests.process import test_launcher as launcher"}
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        text = path.read_text()
        found += [f"{rel}: {m.group(0).strip()}" for m in private.finditer(text)]
        found += [f"{rel}: {m.group(0).strip()}" for m in suite.finditer(text)
                  if m.group(0).strip() != allowed.get(rel)]
    assert not found, found
