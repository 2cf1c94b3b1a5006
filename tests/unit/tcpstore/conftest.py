"""Fixtures of the store's unit tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(client, accepted) over 127.0.0.1."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    yield client, accepted
    for s in (client, accepted, listener):
        s.close()
