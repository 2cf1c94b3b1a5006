"""The nodes' check-in settings (ddpboot/nodes/check.py); the check-in itself runs against a real store in
tests/unit/tcpstore/test_client.py."""

from __future__ import annotations

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.check import DEFAULT_JOIN_TIMEOUT, join_timeout


def test_join_timeout_comes_from_the_rendezvous_settings() -> None:
    assert join_timeout({}) == DEFAULT_JOIN_TIMEOUT == 600.0
    assert join_timeout({"join_timeout": "12.5", "timeout": "900"}) == 12.5


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_join_timeout_must_be_positive_seconds(value: str) -> None:
    with pytest.raises(UsageError, match=f"--rdzv-conf join_timeout={value}: give a number of seconds above 0"):
        join_timeout({"join_timeout": value})
