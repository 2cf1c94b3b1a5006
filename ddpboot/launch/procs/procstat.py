"""A process named by its pid and its start time, so that a pid read back later never signals another process
(`is_process`, `open_process`, `signal_if_same`, `group_still_ours`), over the one reader of /proc/PID/stat
(ddpboot/procfs.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ddpboot.procfs import PROC, read_stat

# --- a process named by its pid and its start time ------------------------------------------------------------
# A pid read back later (from a file, a message, an earlier look at /proc) may name another process by then: the one
# it named exited and the kernel gave the number to a new one. The start time tells them apart, and a pidfd opened
# while the start time still matched names that one process for good (signals through it never reach a newcomer).


def start_of(pid: int) -> int | None:
    """The process's start time (what to record beside its pid); None when it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.start


def is_process(pid: int, start: int | None, proc: Path = PROC) -> bool:
    """Whether `pid` still names the live (not zombie) process that started at `start`; False for no start."""
    stat = read_stat(pid, proc)
    return start is not None and stat is not None and stat.start == start and stat.state not in ("Z", "X")


def open_process(pid: int, start: int | None, proc: Path = PROC) -> int | None:
    """A pidfd for the process `pid` and `start` name (see is_process), checked after it is opened, so it cannot
    name a later process; None when that process is gone; -1 where the kernel gives no pidfds (Linux before 5.3, a
    seccomp filter): then only the check stands between the caller's signal and a newcomer."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError:
        fd = -1
    if not is_process(pid, start, proc):
        if fd >= 0:
            os.close(fd)
        return None
    return fd


def signal_if_same(pid: int, start: int | None, signo: int) -> bool:
    """Send `signo` to the process `pid` and `start` name, through a pidfd; whether it was sent (False: gone, or
    the pid names another process now)."""
    fd = open_process(pid, start)
    if fd is None:
        return False
    try:
        if fd >= 0:
            signal.pidfd_send_signal(fd, signo)
        else:
            os.kill(pid, signo)
    except ProcessLookupError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    return True


def group_still_ours(pgid: int, leader_start: int | None) -> bool:
    """Whether process group `pgid`, led by a process that started at `leader_start`, may still be signalled as
    ours: its leader still runs (same start time), or is gone (then the number is not given to a new process while
    any member of the group lives: killpg reaches those, or nobody). False when the number names another process."""
    stat = read_stat(pgid)
    return stat is None or stat.start == leader_start
