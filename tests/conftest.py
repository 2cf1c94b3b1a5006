"""Fixtures shared by the suites; plain helpers live in tests/support.py. And how `make test` spreads the suite over
pytest-xdist's workers (`-n 4 --dist loadfile`): each file's tests in one worker, in order (they share module
fixtures and jobs), and the files that share the SLURM test cluster or the GPUs in one worker, first."""

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


# Under pytest-xdist with `--dist loadfile` (`make test`), the files that share a resource of the machine run in one
# worker, one after the other: the SLURM tests (one test cluster), and the tests that use real GPUs directly.
SHARED_SCOPES = {"tests/slurm/": "tests/slurm", "tests/gpu/": "tests/gpu",
                 "tests/process/test_worker_api.py": "tests/gpu"}


def shared_scope(nodeid: str) -> str | None:
    return next((scope for prefix, scope in SHARED_SCOPES.items() if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return shared_scope(nodeid) or super()._split_scope(nodeid)

    return SharedFileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the long shared scopes first, so that the other workers
        items.sort(key=lambda item: shared_scope(item.nodeid) is None)  # have the rest of the suite meanwhile
