"""The kernel's process table, read in one place: /proc/PID/stat parsed (a process's, or a thread's under
/proc/self/task), a process's owner, command line and environment variables, and the scan of every process's
environment for one variable. Nothing here decides anything, and it imports nothing of ddpboot, so every layer may
read /proc through it: the launcher (the supervisor's CPU samples, the leftover search, the GPU watch's owners,
`ddpboot top`'s sampler, `ddpboot stacks` finding its jobs), a rank (worker/exiting.py: its threads' states) and
the cluster environments (an MPI rank's launcher process). Every reader answers None (or nothing) for a process
that is gone or unreadable: a process may exit between any two reads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TASKS = Path("/proc/self/task")  # this process's threads, each read as a process of its own
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
    """The process's stat line, parsed (the command name may hold spaces and parentheses: the fields are counted
    from its last `)`); None when it is gone (or pid is 0 or less: not started)."""
    if pid <= 0:
        return None
    try:
        raw = (proc / str(pid) / "stat").read_bytes().decode(errors="replace")
        comm = raw[raw.find("(") + 1 : raw.rfind(")")]
        f = raw[raw.rfind(")") + 2 :].split()
        return ProcStat(comm, f[0], int(f[1]), (int(f[11]) + int(f[12])) / TICKS, int(f[19]), int(f[21]) * PAGE)
    except (OSError, IndexError, ValueError):
        return None


def pids(proc: Path = PROC) -> list[int]:
    """Every pid in the table (every thread id under TASKS); OSError where it cannot be listed."""
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def listed_pids(proc: Path = PROC) -> list[int]:
    """`pids`, and none where the table cannot be listed: for a scan that finds what it can."""
    try:
        return pids(proc)
    except OSError:
        return []


def listed_children(pid: int, proc: Path = PROC) -> set[int] | None:
    """The pids whose parent is `pid`, zombies included, from each of its threads' `children` list (one small read
    instead of a scan of the whole table); None where the kernel has no such list (CONFIG_PROC_CHILDREN) or the
    process is gone."""
    found: set[int] = set()
    try:
        for tid in os.listdir(proc / str(pid) / "task"):
            found.update(int(c) for c in (proc / str(pid) / "task" / tid / "children").read_bytes().split())
    except (OSError, ValueError):
        return None
    return found


def owner(pid: int, proc: Path = PROC) -> int | None:
    """The uid the process runs as (its /proc directory's owner); None when gone."""
    try:
        return (proc / str(pid)).stat().st_uid
    except OSError:
        return None


def cmdline(pid: int, proc: Path = PROC) -> list[str] | None:
    """The process's arguments (none for a kernel thread or a zombie); None when gone."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return [a.decode(errors="replace") for a in argv if a]


def environ_value(pid: int, name: str, proc: Path = PROC) -> str | None:
    """The value of variable `name` in the process's environment (as it was at exec); None when it has none, or
    the environment cannot be read (another user's, a process that is gone)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    key = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def environ_values(name: str, uid: int, proc: Path = PROC) -> dict[int, str]:
    """pid → the value of `name` for every process of `uid` whose environment has it."""
    mine = (pid for pid in listed_pids(proc) if owner(pid, proc) == uid)
    return {pid: value for pid in mine if (value := environ_value(pid, name, proc)) is not None}


def peak_rss(pid: int, proc: Path = PROC) -> int | None:
    """The most the process has held resident since it started (VmHWM of /proc/PID/status), in bytes; None when
    gone or unreadable."""
    try:
        for line in (proc / str(pid) / "status").read_text(errors="replace").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def cgroups(pid: int | str, proc: Path = PROC) -> list[tuple[str, str]] | None:
    """The process's cgroups (/proc/PID/cgroup; `pid` "self": this process's): (controllers, path) per hierarchy,
    "" for cgroup v2's one hierarchy; None when gone."""
    try:
        text = (proc / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    out = []
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        out.append((controllers, path))
    return out


def cpu_limit(pid: int, proc: Path = PROC) -> tuple[float | None, float | None] | None:
    """The process's CPU-time limit, RLIMIT_CPU (soft, hard) in seconds, None for unlimited (/proc/PID/limits);
    None when gone."""
    try:
        text = (proc / str(pid) / "limits").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max cpu time"):
            words = line.split()
            soft, hard = words[3], words[4]
            return (None if soft == "unlimited" else float(soft)), (None if hard == "unlimited" else float(hard))
    return None, None


def wait_channel(pid: int, proc: Path = PROC) -> str:
    """The kernel function a process sleeps in (/proc/PID/wchan), '?' when unknown."""
    try:
        return (proc / str(pid) / "wchan").read_text(errors="replace").strip() or "?"
    except OSError:
        return "?"
