"""Fixtures that are resolved inside each rank: `@ddpboot.testing.rank_fixture`.

    @rank_fixture
    def group_sum(ddp_ctx):                  # runs in every rank, after ddpboot.init(); may use the process group
        import torch, torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

In the pytest process such a fixture is an ordinary pytest fixture whose value is a `RankFixtureRef`: the file and
name of the function, and the values of its own arguments that pytest resolved there (`tmp_path`, a parameter, an
ordinary fixture). The ref is pickled to the ranks with the test's other arguments; each rank calls the function
(a generator's code after `yield` runs after the test) with `ddp_ctx`, other rank fixtures and those values.
Light on purpose: imported by the plugin in the pytest process (no torch).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pytest

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_ARG = "ddp_ctx"  # the argument every rank fills with its ddpboot Context
_REGISTRY: dict[tuple[str, str], Callable[..., Any]] = {}  # (file, name) -> the undecorated function


@dataclass(frozen=True)
class RankFixtureRef:
    """A rank fixture as the pytest process passes it to the ranks."""

    path: str
    module: str
    name: str
    values: dict[str, Any] = field(default_factory=dict)  # the arguments resolved in the pytest process


def rank_fixture(fn: F) -> F:
    """Make `fn` a pytest fixture that every rank of a `ddp` test resolves for itself (see the module's text)."""
    path = inspect.getfile(fn)
    _REGISTRY[(path, fn.__name__)] = fn
    local = [p for p in inspect.signature(fn).parameters if p != CONTEXT_ARG]

    def in_pytest(request: pytest.FixtureRequest) -> RankFixtureRef:
        values = {name: request.getfixturevalue(name) for name in local}
        return RankFixtureRef(path, fn.__module__, fn.__name__, values)

    in_pytest.__doc__ = fn.__doc__
    return cast(F, pytest.fixture(name=fn.__name__)(in_pytest))


def registered(path: str, name: str) -> Callable[..., Any] | None:
    """The function a rank fixture wraps, once its file has been imported in this process."""
    return _REGISTRY.get((path, name))
