"""Fixtures shared by the suites; plain helpers live in tests/support.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def fake_gpus(tmp_path: Path) -> Callable[[Iterable[dict[str, Any]]], str]:
    """Write a simulated inventory (a list of GPU objects) and return its path for DDPBOOT_FAKE_GPUS."""
    counter = iter(range(1000))

    def write(gpus: Iterable[dict[str, Any]]) -> str:
        path = tmp_path / f"gpus{next(counter)}.json"
        path.write_text(json.dumps(list(gpus)))
        return str(path)

    return write
