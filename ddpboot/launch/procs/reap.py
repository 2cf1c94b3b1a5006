"""Reaping without waiting: every child of this process that has exited, with its wait status. Standard library
only: the launcher's loop imports it, and the fast-start and warm processes, which import nothing of ddpboot, load it
from this file (launch/faststart/zygote.py's `load_file`)."""

from __future__ import annotations

import os
from collections.abc import Iterator


def exited() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each exited child, reaped, until none is left to reap now (or none is left at all)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status
