"""One process's /proc/PID/stat, read once for everyone who asks: the supervisor's CPU sampling (--stall-timeout),
the leftover search (parent, start time, zombie) and `ddpboot top` (CPU, memory, state)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    comm: str
    state: str  # the kernel's state letter: R, S, D, Z, ...
    ppid: int
    cpu: float  # seconds of CPU, user + system, every thread
    start: int  # start time in clock ticks since boot: a pid and this name a process
    rss: int  # resident bytes


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process's stat line, parsed; None when it is gone (or pid is 0 or less: not started)."""
    if pid <= 0:
        return None
    try:
        raw = (proc / str(pid) / "stat").read_bytes().decode(errors="replace")
        comm = raw[raw.find("(") + 1 : raw.rfind(")")]
        f = raw[raw.rfind(")") + 2 :].split()
        return ProcStat(comm, f[0], int(f[1]), (int(f[11]) + int(f[12])) / TICKS, int(f[19]), int(f[21]) * PAGE)
    except (OSError, IndexError, ValueError):
        return None
