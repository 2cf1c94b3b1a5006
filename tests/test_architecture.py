"""The shape of the code, checked like behaviour: the layers (import-linter's contracts in pyproject.toml), the
complexity and size limits, no dead code, and a repository that stands alone (docs/architecture.md)."""

from __future__ import annotations

import ast
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


def _module_imports() -> dict[str, set[str]]:
    """ddpboot module → the ddpboot modules it imports: at the top, in a function, under TYPE_CHECKING, or by name
    through importlib.import_module("ddpboot...") (`from a import b` counts as importing a.b where b is a module)."""
    modules = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                targets += [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
                  "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                targets.append(str(node.args[0].value))
        graph[name] = {t for t in map(known, targets) if t is not None and t != name and not name.startswith(t + ".")}
    return graph


def test_no_modules_import_each_other_in_a_circle() -> None:
    """No cycle among the package's modules, lazy imports and importlib's string targets included (import-linter's
    acyclic contract sees neither a module imported by its name in a string nor a cycle through a package's
    __init__)."""
    graph = _module_imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


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


def test_tests_import_no_private_name() -> None:
    private = re.compile(r"^\s*from ddpboot[\w.]* import [^#\n]*\b_[a-z]\w*", re.M)
    found = [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for path in sorted((REPO / "tests").rglob("*.py"))
             for m in private.finditer(path.read_text())]
    assert not found, found


def _suite_imports() -> set[tuple[str, str]]:
    """(importer, imported) for every test module (test_*.py) that a file under tests/ imports, as repository paths."""
    found = set()
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("tests.") and target.rsplit(".", 1)[-1].startswith("test_"):
                    found.add((str(path.relative_to(REPO)), target.replace(".", "/") + ".py"))
    return found


def test_a_suite_imports_another_only_where_the_doc_says_so() -> None:
    """docs/architecture.md lists each test module that imports another (to rerun its tests in another mode), as
    `importer` → `imported`; no other test module is imported, and each listed import is there."""
    block = _doc_block("suites-importing-a-suite")
    documented = set(re.findall(r"^- `(tests/[\w/]+\.py)` → `(tests/[\w/]+\.py)`", block, re.M))
    assert documented, "docs/architecture.md lists no suite that imports another (the block is empty or misspelt)"
    found = _suite_imports()
    unlisted = found - documented
    assert not unlisted, f"test modules importing another, not in docs/architecture.md: {unlisted}"
    assert documented - found == set(), f"listed in docs/architecture.md, but no such import: {documented - found}"


# --- docs/architecture.md's map, checked against the tree -----------------------------------------------------

DOC = REPO / "docs" / "architecture.md"
_TICKED = re.compile(r"`([\w./-]+)`")


def _doc_block(name: str) -> str:
    doc = DOC.read_text()
    assert f"<!-- {name} -->" in doc, f"docs/architecture.md has no <!-- {name} --> block"
    return doc.split(f"<!-- {name} -->", 1)[1].split("<!-- end -->", 1)[0]


def _folder_rows() -> dict[str, tuple[str, str]]:
    """The table of folders: its first cell (`launch/procs/`, or a top-level module `procfs.py`) → (what lives
    there, tests)."""
    rows = {}
    for line in _doc_block("folders").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (m := re.fullmatch(r"`([\w/]+(?:/|\.py))`", cells[0])):
            rows[m.group(1)] = (cells[1], cells[2])
    return rows


def _resolves(name: str, *bases: Path) -> bool:
    return any((base / name).exists() for base in bases)


def test_the_map_names_every_module_in_its_folders_row() -> None:
    """Each folder of the package has a row in docs/architecture.md's table, which names (in backticks) each of its
    modules (`name.py`) and subfolders (`name/`, each with a row of its own); each top-level module has a row;
    and every file the table names exists."""
    rows = _folder_rows()
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    problems = [f"{p.relative_to(PACKAGE)}/: no row" for p in packages if f"{p.relative_to(PACKAGE)}/" not in rows]
    problems += [f"{p.name}: no row" for p in sorted(PACKAGE.glob("*.py"))
                 if p.name not in ("__init__.py", "__main__.py") and p.name not in rows]
    for first, (lives, tests) in rows.items():
        folder = PACKAGE / first
        if not folder.exists():
            problems.append(f"{first}: a row, but no such folder or module")
            continue
        named = set(_TICKED.findall(lives))
        if folder.is_dir():
            have = {p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
            have |= {f"{p.parent.name}/" for p in folder.glob("*/__init__.py")}
            problems += [f"{first}{name}: not named in its row" for name in sorted(have - named)]
        local = folder if folder.is_dir() else PACKAGE
        problems += [f"{first}: names `{name}`, which does not exist" for name in sorted(named)
                     if re.fullmatch(r"[\w/]+(?:/|\.py)", name) and not _resolves(name, local, PACKAGE, REPO)]
        bases = [REPO, REPO / "tests" / "process"]  # a bare name is of the folder named before it, or a process test
        for name in _TICKED.findall(tests):
            if name.endswith((".py", "/")) and not _resolves(name, *bases):
                problems.append(f"{first}: its tests name `{name}`, which does not exist")
            if name.endswith("/"):
                bases.append(REPO / name)
    assert not problems, "docs/architecture.md's table of folders and the tree differ: " + "; ".join(problems)


def _layers_in_doc() -> list[set[str]]:
    """The layers as the doc's drawing lists them, top down: the folder and module names that start each line."""
    drawing = DOC.read_text().split("## The layers", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    layers = []
    for line in drawing.splitlines():
        words = re.match(r"^((?:[a-z_]+(?:/|\.py)\s+)+)", line + " ")
        if words:
            layers.append({w.removesuffix("/").removesuffix(".py") for w in words.group(1).split()})
    return layers


def test_the_doc_draws_the_layers_of_the_contract() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in config if c["type"] == "layers")
    layers = [{m.strip().removeprefix("ddpboot.") for m in layer.split("|")} for layer in contract["layers"]]
    assert _layers_in_doc() == layers


def _imports_of(folder: Path) -> set[str]:
    """Every ddpboot module the modules of `folder` import (lazy imports included), outside that folder."""
    own = "ddpboot." + ".".join(folder.relative_to(PACKAGE).parts)
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("ddpboot") and not m.startswith(own)}


def test_a_rank_imports_what_the_doc_allows_the_worker_api() -> None:
    """docs/architecture.md: `worker/` may import only the folders and modules it names; the code keeps to them."""
    sentence = re.search(r"`worker/`.*?\smay\simport\sonly\s(.*?),\sso\s", DOC.read_text(), re.S)
    assert sentence, "docs/architecture.md no longer says what `worker/` may import"
    allowed = ["ddpboot." + name.removesuffix("/").removesuffix(".py").replace("/", ".")
               for name in _TICKED.findall(sentence.group(1))]
    outside = sorted(m for m in _imports_of(PACKAGE / "worker")
                     if not any(m == a or m.startswith(a + ".") for a in allowed))
    assert not outside, f"worker/ imports what docs/architecture.md does not allow it: {outside}"


def test_the_worked_example_of_an_observer_runs(tmp_path: Path) -> None:
    """docs/architecture.md's observer (its module and its unit test, run as written) works on the observers' fake
    attempt, and the lines of OBSERVERS it is shown between are the real list's."""
    from ddpboot.launch import observe
    from tests.unit.launch.observe import jobs

    section = DOC.read_text().split("## Adding an observer", 1)[1]
    module, where, test = re.findall(r"```python\n(.*?)```", section, re.S)
    example: dict[str, object] = {"__name__": "timelimit"}
    exec(compile(module, "timelimit.py", "exec"), example)
    namespace: dict[str, object] = {**example, "Path": Path, "Clock": jobs.Clock, "Attempt": jobs.Attempt,
                                    "job": jobs.job}
    exec(compile(test, "test_timelimit.py", "exec"), namespace)
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert tests, "the worked example has no test function"
    for case in tests:
        case(tmp_path)
    shown = [line.split("#")[0].strip().removesuffix(",") for line in where.splitlines() if line.strip()]
    real = [make.__qualname__ for make in observe.OBSERVERS]
    others = [name for name in shown if name != "TimeLimit.start"]
    assert len(others) == len(shown) - 1 and others[-1] == real[-1], (shown, real)  # the status file stays last
    assert others == [name for name in real if name in others], (shown, real)  # real lines, in the real order
