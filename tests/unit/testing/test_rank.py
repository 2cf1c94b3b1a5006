"""A rank resolves rank fixtures itself: with its Context, the values the pytest process sent, other rank fixtures,
and a generator's teardown after the test."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpboot.testing.fixtures import RankFixtureRef
from ddpboot.testing.loader import load_test_module
from ddpboot.testing.rank import resolve

FIXTURES = """
from ddpboot.testing import rank_fixture

EVENTS = []


@rank_fixture
def base(ddp_ctx, k):
    return ddp_ctx.rank * 10 + k


@rank_fixture
def model(base):
    EVENTS.append("setup")
    yield base + 1
    EVENTS.append("teardown")
"""


def test_rank_fixtures_resolve_in_the_rank(tmp_path: Path) -> None:
    path = tmp_path / "conftest_for_rank.py"
    path.write_text(FIXTURES)
    name = "conftest_for_rank"
    try:
        base = RankFixtureRef(str(path), name, "base", {"k": 3})
        model = RankFixtureRef(str(path), name, "model", {"base": base})
        ctx = SimpleNamespace(rank=1)
        with contextlib.ExitStack() as stack:  # the file is not imported yet: the rank imports it
            assert resolve(model, ctx, stack) == 14
            assert resolve(5, ctx, stack) == 5
            events = load_test_module(str(path), name).EVENTS
            assert events == ["setup"]
        assert events == ["setup", "teardown"]
    finally:
        sys.modules.pop(name, None)


def test_an_unknown_rank_fixture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "conftest_without.py"
    path.write_text("X = 1\n")
    try:
        with pytest.raises(LookupError, match="rank fixture 'gone' is not in"), contextlib.ExitStack() as stack:
            resolve(RankFixtureRef(str(path), "conftest_without", "gone"), None, stack)
    finally:
        sys.modules.pop("conftest_without", None)
