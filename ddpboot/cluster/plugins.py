"""Cluster environments from other packages: entry points of the group `ddpboot.environments`.

A package adds an environment by declaring its `ClusterEnvironment` subclass in its own pyproject.toml:

    [project.entry-points."ddpboot.environments"]
    flux = "mysite.flux_env:FluxEnvironment"

and `ddpboot.init()` then recognises processes its launcher started, with no change to ddpboot. (torch finds its
rendezvous handlers and submitit its executors the same way.)

ddpboot's own environments are not entry points: they are listed in code (`ddpboot.cluster.ENVIRONMENTS`), in an
order that matters and is tested, and they work where no package metadata exists (a source checkout on
PYTHONPATH, a vendored copy). Installed environments are asked after them, in the order of their entry-point names:
a package cannot change how a process that ddpboot already recognises is read (a `detect` that is too broad would
otherwise take over every torchrun or srun job of the environment it is installed in). An environment that must win
over a built-in one is chosen by the script: `ddpboot.init(environment=MyEnvironment)`.

The entry points are read once per process, and only when no built-in environment recognised it, so the
launchers ddpboot knows pay nothing for the scan of installed packages. An entry point that cannot be loaded (an
import error, an object that is not a ClusterEnvironment subclass) is skipped; `failures` holds one message naming
it, which `ddpboot.init()` gives as one warning.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from ddpboot.cluster.base import ClusterEnvironment

if TYPE_CHECKING:  # importlib.metadata costs the launcher ~8 ms at start; it is imported when the plugins are read
    from importlib.metadata import EntryPoint

GROUP = "ddpboot.environments"


class Plugins(NamedTuple):
    """The environments the entry points name, in detection order, and one message per entry point skipped."""

    environments: tuple[type[ClusterEnvironment], ...]
    failures: tuple[str, ...]


def load_plugins(entry_points: Iterable[EntryPoint]) -> Plugins:
    """Load each entry point (sorted by name, then value); skip and describe the ones that fail."""
    classes: list[type[ClusterEnvironment]] = []
    failures: list[str] = []
    for ep in sorted(entry_points, key=lambda e: (e.name, e.value)):
        where = _describe(ep)
        try:
            obj = ep.load()
        except Exception as exc:  # any error of a third-party import: the job must still start
            failures.append(f"{where} could not be loaded ({type(exc).__name__}: {exc}); ddpboot skipped it. Fix: "
                            "install what it needs, or uninstall the package that declares it.")
            continue
        problem = _not_an_environment(obj)
        if problem:
            failures.append(f"{where} names {problem}; ddpboot skipped it. Fix: point the entry point at a "
                            "concrete ddpboot.cluster.ClusterEnvironment subclass.")
        elif obj not in classes:  # one package seen twice on sys.path
            classes.append(obj)
    return Plugins(tuple(classes), tuple(failures))


@functools.cache
def installed_plugins() -> Plugins:
    """The installed entry points of GROUP, loaded on the first call and kept for the life of the process."""
    import importlib.metadata

    return load_plugins(importlib.metadata.entry_points(group=GROUP))


def plugin_failures() -> tuple[str, ...]:
    """The messages of the entry points skipped so far; empty while they have not been read."""
    return installed_plugins().failures if installed_plugins.cache_info().currsize else ()


def _describe(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    source = f" (declared by {dist.name} {dist.version})" if dist is not None else ""
    return f"the cluster environment entry point {ep.name} = {ep.value!r} of group {GROUP}{source}"


def _not_an_environment(obj: object) -> str:
    """Why `obj` cannot be a detected environment, or '' when it can."""
    if not isinstance(obj, type) or not issubclass(obj, ClusterEnvironment):
        return f"{obj!r}, which is not a ClusterEnvironment subclass"
    if inspect.isabstract(obj):
        return f"{obj.__name__}, which is abstract (it lacks detect or __init__)"
    if not isinstance(getattr(obj, "name", None), str):
        return f"{obj.__name__}, which has no `name` (what ddpboot.Context.launcher reports)"
    return ""
