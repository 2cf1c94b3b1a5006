"""Fixtures shared by the suites; plain helpers live in tests/support.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
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


@pytest.fixture
def store_port() -> Iterator[int]:
    """ddpboot's store server on a loopback port, in a daemon thread (it serves until the test process ends)."""
    from ddpboot.tcpstore.server import serve_forever

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    threading.Thread(target=serve_forever, args=(sock,), daemon=True).start()
    yield int(sock.getsockname()[1])


@pytest.fixture
def lockdir(tmp_path: Path) -> Path:
    """A fresh GPU lock directory, prepared as the launcher prepares its own."""
    from ddpboot.selection.locks import prepare_lock_dir

    return prepare_lock_dir(tmp_path / "locks")
