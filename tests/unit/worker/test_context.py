"""The Context's lifecycle: context() before init(), and `with ddpboot.init()` shutting down on the way out."""

from __future__ import annotations

import pytest

import ddpboot
from ddpboot.errors import NotInitializedError


def test_context_before_init_says_what_to_call() -> None:
    with pytest.raises(NotInitializedError, match=r"ddpboot.init\(\)"):
        ddpboot.context()


def test_context_manager_shuts_down() -> None:
    with ddpboot.init() as ctx:
        assert ddpboot.context() is ctx
    with pytest.raises(NotInitializedError):
        ddpboot.context()
    ddpboot.shutdown()  # again: harmless
    assert ddpboot.init() is not ctx  # a fresh context after shutdown
