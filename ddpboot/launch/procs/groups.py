"""Signalling a worker's process group, and only a worker's.

Every worker is started in a session of its own (spawn.py, the fast-start zygote), so its pid is its process group
id and `killpg(pid)` reaches it and what it started. A number that is not such a group must never reach killpg:
`killpg(0, ...)` signals the caller's own group, which holds the launcher and the shell or `make` that started it,
and `killpg(1, ...)` is every process the user may signal. `signal_group` is the one way the launcher's processes
(the supervisor, the guardian, smoke) signal a group, and it refuses those numbers with a bug report instead of
carrying them out.
"""

from __future__ import annotations

import os


class NotOurGroup(RuntimeError):
    """A process group id that cannot be a worker's: signalling it would reach processes the job does not own."""


def check_group(pgid: int) -> int:
    """`pgid` if it can be a worker's process group; NotOurGroup for 0, 1, negatives and the caller's own group."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise NotOurGroup(f"ddpboot bug: refusing to signal process group {pgid}, which is not a worker's (the "
                          f"launcher's own group is {os.getpgrp()})")
    return pgid


def signal_group(pgid: int, signo: int) -> None:
    """killpg a worker's group; ProcessLookupError once it is empty, as killpg."""
    os.killpg(check_group(pgid), signo)


def signal_process(pid: int, signo: int) -> None:
    """os.kill one process by its pid, refusing the numbers that mean a group (0: the caller's own, -N, 1: every
    process); ProcessLookupError once it is gone, as os.kill."""
    if pid <= 1:
        raise NotOurGroup(f"ddpboot bug: refusing os.kill({pid}), which signals a group of processes, not one")
    os.kill(pid, signo)
