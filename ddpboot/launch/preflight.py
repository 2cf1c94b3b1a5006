"""Checks made before anything starts: the program exists and can run, the store's port can be bound.

Each failure is a UsageError (exit 2, nothing started) naming what was asked, what exists and what to do. The
module check finds the module the way `python -m` will, without importing it (importing a package's __init__ in
the launcher could run arbitrary code, or import torch).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.spec import Target


def check_target(target: Target, python: str, env: Mapping[str, str], cwd: Path) -> Target:
    """The target with its name made absolute where that matters (a binary found on PATH); raises UsageError."""
    if target.kind in ("script", "run_path"):
        _check_script(target.name, cwd, "--run-path" if target.kind == "run_path" else "")
        return target
    if target.kind == "module":
        _check_module(target.name, python, env, cwd)
        return target
    return Target(target.kind, _check_binary(target.name, env, cwd), target.args)


def _check_script(name: str, cwd: Path, via: str) -> None:
    path = Path(name) if os.path.isabs(name) else cwd / name
    what = f"the script {name!r}" + (f" ({via})" if via else "")
    if not path.exists():
        near = sorted(p.name for p in path.parent.glob("*.py"))[:8] if path.parent.is_dir() else []
        hint = f" Python files there: {', '.join(near)}." if near else ""
        raise UsageError(
            f"{what} does not exist (looked for {path}).{hint} Give the path of the training script; for a module "
            "use -m NAME, for a program on PATH --no-python."
        )
    if path.is_dir():
        if not (path / "__main__.py").is_file():
            raise UsageError(f"{what} is a directory without __main__.py; give the script inside it.")
        return
    if not os.access(path, os.R_OK):
        raise UsageError(f"{what} exists but is not readable by you ({path}); check its permissions.")


def _search_path(python: str, env: Mapping[str, str], cwd: Path) -> list[str]:
    """Where `python -m` looks: the current directory, PYTHONPATH, then the interpreter's own path."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [str(cwd), *extra, *sys.path[1:]]


def is_module_name(name: str) -> bool:
    """Dotted identifiers (mypkg.train), as `python -m` and `import` take them."""
    return all(part.isidentifier() for part in name.split("."))


def _check_module(name: str, python: str, env: Mapping[str, str], cwd: Path) -> None:
    if name.endswith(".py") or os.sep in name:
        stem = name.removesuffix(".py").replace(os.sep, ".").strip(".")
        raise UsageError(
            f"-m {name}: that is a file name, not a module name. Drop -m to run the script, or write -m {stem}."
        )
    if not is_module_name(name):
        raise UsageError(f"-m {name!r} is not a module name (dotted identifiers, e.g. -m mypkg.train).")
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return  # another interpreter (PYTHON_EXEC): only it knows its modules; it will say so itself
    parts = name.split(".")
    saved = list(sys.path)
    try:
        sys.path[:] = _search_path(python, env, cwd)
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else sys.modules[parts[0]].__spec__
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    if spec is None:
        raise UsageError(
            f"-m {name}: no module named {parts[0]!r} in the current directory ({cwd}), PYTHONPATH or the packages "
            f"of {python}. Check the name, run from the directory that contains it, or add it to PYTHONPATH."
        )
    found = parts[0]
    for part in parts[1:]:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            raise UsageError(f"-m {name}: {found!r} ({spec.origin if spec else '?'}) is a module, not a package, "
                             f"so it has no submodule {part!r}.")
        fullname = f"{found}.{part}"
        spec = importlib.machinery.PathFinder.find_spec(fullname, list(locations))
        if spec is None:
            where = ", ".join(str(x) for x in locations)
            raise UsageError(f"-m {name}: package {found!r} ({where}) has no module {part!r}.")
        found = fullname
    if spec is not None and spec.submodule_search_locations and spec.origin not in (None, "namespace"):
        main = importlib.machinery.PathFinder.find_spec(f"{found}.__main__", list(spec.submodule_search_locations))
        if main is None:
            raise UsageError(f"-m {name} is a package without __main__.py; name the module to run inside it.")


def _check_binary(name: str, env: Mapping[str, str], cwd: Path) -> str:
    if os.sep in name:
        path = Path(name) if os.path.isabs(name) else cwd / name
        if not path.exists():
            raise UsageError(f"--no-python: the program {name!r} does not exist (looked for {path}).")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise UsageError(
                f"--no-python: {name!r} is not executable ({path}). Make it executable (chmod +x), or drop "
                "--no-python to run a Python script."
            )
        return str(path)
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(
            f"--no-python: no program {name!r} on PATH ({env.get('PATH', os.defpath)}). Give its path, or drop "
            "--no-python to run a Python script."
        )
    return found
