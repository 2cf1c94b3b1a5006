"""Processes a job leaves behind: a rank's daemon (`fork(); setsid(); fork()`), a server it started with
`start_new_session=True`, anything that left the rank's process group and so outlives the group's signals.

Two ways to find them, used together:

- **The tree.** The launcher is a child subreaper (PR_SET_CHILD_SUBREAPER), so a process whose parent exits is
  reparented to the launcher, however often it forked or changed session. After an attempt, every child of the
  launcher that it did not start itself (the guardian, the fast-start process, the rendezvous agent, the ranks) is
  something a rank left behind, with all its descendants. Ranks forked by the fast-start process or a warm session
  (launch/faststart/zygote.py) are its children, and it is a subreaper too: the same holds below it (`adopters`),
  and it ends everything below it when the launcher is gone, `kill -9` included.
- **The mark.** Every rank's environment holds TORCHELASTIC_ERROR_FILE, a path inside the job's run directory, and
  a child inherits it. A process of the launcher's user whose environment still holds a path under that directory
  belongs to the job. This is what the guardian uses after the launcher was killed with SIGKILL: an exec'd rank's
  leftovers are then no longer in any tree of ours.

What neither finds: a process that both cleared its environment (`env -i`, a daemon that rebuilds its environment)
and left the launcher's tree before the launcher ended (an exec'd rank's: a forked rank's stays in the fast-start
process's tree), or one that runs as another user. A process that another tool moved away (systemd-run, a
container runtime) is found only by its mark.

The decisions (`leftovers`, `describe`) are pure functions of a process table; `snapshot` reads the table from
/proc and `end` signals through pidfds (a pid reused between the snapshot and the signal is never hit: the pidfd
is opened only if the process's start time is still the one the snapshot saw).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ddpboot.contract import ERROR_FILE_VAR
from ddpboot.launch.procs.procstat import is_process, open_process
from ddpboot.launch.rundir import rank_of_error_file
from ddpboot.procfs import PROC, cmdline, environ_value, listed_children, listed_pids, owner, read_stat


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    uid: int
    start: int  # start time in clock ticks since boot (/proc/PID/stat field 22): a pid and this name a process
    cmd: str  # its command line (the program's name and its arguments), or [comm] when it has none
    error_file: str | None = None  # TORCHELASTIC_ERROR_FILE from its environment, when it has one and we may read it
    zombie: bool = False


def read_proc(pid: int, proc: Path = PROC) -> Proc | None:
    """One process as the table holds it; None when it is gone."""
    stat = read_stat(pid, proc)
    if stat is None:
        return None
    zombie = stat.state == "Z"
    uid, words = owner(pid, proc), cmdline(pid, proc)
    if uid is None or words is None:
        return None
    cmd = " ".join([os.path.basename(words[0]), *words[1:]]) if words else f"[{stat.comm}]"
    mine = uid == os.getuid()  # another user's environment is not ours to read (root could)
    error_file = environ_value(pid, ERROR_FILE_VAR, proc) if mine and not zombie else None
    return Proc(pid, stat.ppid, uid, stat.start, cmd, error_file, zombie)


def snapshot(proc: Path = PROC) -> dict[int, Proc]:
    """Every process this user can see, by pid."""
    return {pid: p for pid in listed_pids(proc) if (p := read_proc(pid, proc)) is not None}


def children(pid: int, proc: Path = PROC) -> set[int]:
    """The pids whose parent is `pid` now: the kernel's list of them, else from a scan of the table."""
    listed = listed_children(pid, proc)
    if listed is not None:
        return listed
    return {p.pid for p in snapshot(proc).values() if p.ppid == pid}


def descendants(table: Mapping[int, Proc], roots: Iterable[int]) -> set[int]:
    """The roots and every process below them in `table`."""
    by_parent: dict[int, list[int]] = {}
    for p in table.values():
        by_parent.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(by_parent.get(pid, ()))
    return found


def marked(table: Mapping[int, Proc], run_dir: Path, uid: int) -> set[int]:
    """The processes of `uid` whose TORCHELASTIC_ERROR_FILE lies in `run_dir` (absolute: a relative path could be
    another job's, started in another directory): the job's, wherever they are."""
    if not run_dir.is_absolute():
        return set()
    prefix = str(run_dir).rstrip("/") + "/"
    return {p.pid for p in table.values()
            if p.uid == uid and p.error_file is not None and p.error_file.startswith(prefix)}


def leftovers(
    table: Mapping[int, Proc], launcher: int, own: Iterable[int], run_dir: Path, uid: int,
    adopters: Iterable[int] = (),
) -> list[Proc]:
    """What the job left running: the launcher's children it did not start (`own`: the guardian, the fast-start
    process, the agent, the ranks) and their descendants, the same below `adopters` (the fast-start process or warm
    session that forks the ranks: a subreaper too, so a forked rank's orphans are its children), and every process
    marked with the run directory; never the launcher, its ancestors' line or anything in `own` (or below it,
    except what carries the mark)."""
    own = set(own)
    parents = {launcher, *adopters}
    kept = own | parents
    roots = {p.pid for p in table.values() if p.ppid in parents and p.pid not in kept}
    found = descendants(table, roots) | marked(table, run_dir, uid)
    return [table[pid] for pid in sorted(found - kept) if pid > 1]


def rank_of(p: Proc) -> int | None:
    """The rank whose environment the process inherited (its error file's name), when it has one."""
    return rank_of_error_file(p.error_file or "")


def _short(cmd: str, width: int = 72) -> str:
    return cmd if len(cmd) <= width else cmd[: width - 1] + "…"


def describe(found: list[Proc], killed: Iterable[int] = (), at_once: bool = False) -> str:
    """One note: which ranks left which processes, and how each was ended (`at_once`: SIGKILL, no grace)."""
    hard = set(killed)
    by_rank: dict[int | None, list[Proc]] = {}
    for p in found:
        by_rank.setdefault(rank_of(p), []).append(p)
    parts = []
    for rank in sorted(by_rank, key=lambda r: (r is None, r or 0)):
        procs = by_rank[rank]
        who = f"rank {rank}" if rank is not None else "a rank"
        listed = ", ".join(f"pid {p.pid} ({_short(p.cmd)})" for p in procs)
        parts.append(f"{who} left {len(procs)} process{'es' if len(procs) > 1 else ''} running: {listed}")
    how = "ended with SIGTERM" if not hard else (
        "SIGKILL after the grace for " + ", ".join(f"pid {pid}" for pid in sorted(hard)))
    if at_once:
        how = "ended with SIGKILL at once (the launcher was told to stop)"
    return (f"ddpboot: {'; '.join(parts)}; {how} (a process a rank starts must end with it: "
            "see 'Processes a rank leaves behind' in docs/reference.md)")


def _open(p: Proc, proc: Path) -> int | None:
    """A pidfd for the process the snapshot saw (procstat.open_process: None when gone or its pid names another
    process now, -1 without pidfds)."""
    return open_process(p.pid, p.start, proc)


def _same(p: Proc, proc: Path) -> bool:
    """Whether p's pid still names the process the snapshot saw (its start time), alive."""
    return is_process(p.pid, p.start, proc)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # ours when it was reparented to us; a zombie otherwise stays readable


def _send(pid: int, fd: int, signo: int, p: Proc, proc: Path) -> bool:
    """Signal the process (through its pidfd, else by pid after checking it is still the one seen); whether sent."""
    try:
        if fd >= 0:
            signal.pidfd_send_signal(fd, signo)
        elif _same(p, proc):
            os.kill(pid, signo)
        else:
            return False
    except ProcessLookupError:
        return False
    return True


class Hurry(Protocol):
    """What cuts a grace short: readable when something may have happened (the launcher's signalfd), then asked."""

    def fileno(self) -> int: ...

    def __call__(self) -> bool:
        """True: stop waiting now (a second Ctrl-C)."""
        ...


def _wait(handles: dict[int, tuple[int, Proc]], deadline: float, proc: Path, hurry: Hurry | None = None) -> None:
    """Until every process of `handles` (pid: (pidfd or -1, the process seen)) exited, the deadline, or `hurry`
    says so; those exited are removed (and reaped when they are ours)."""
    while handles:
        for pid in [pid for pid, (fd, p) in handles.items() if fd < 0 and not _same(p, proc)]:
            _reap(pid)
            del handles[pid]
        left = deadline - time.monotonic()
        if not handles or left <= 0:
            return
        fds = {fd: pid for pid, (fd, _) in handles.items() if fd >= 0}
        plain = len(fds) < len(handles)
        extra = [hurry.fileno()] if hurry is not None else []
        ready, _, _ = select.select([*fds, *extra], [], [], min(left, 0.05) if plain else left)
        if hurry is not None and extra[0] in ready and hurry():
            return
        for fd in ready:
            if fd not in fds:
                continue
            pid = fds[fd]
            _reap(pid)
            os.close(fd)
            del handles[pid]


def end(found: list[Proc], grace: float, proc: Path = PROC, first: int = signal.SIGTERM,
        hurry: Hurry | None = None) -> tuple[list[int], list[int]]:
    """Send `first` to each process, SIGKILL to those still running after `grace` seconds (or as soon as `hurry`
    says so); (the pids signalled, those that needed SIGKILL). The launcher's own children among them are reaped."""
    handles: dict[int, tuple[int, Proc]] = {}
    signalled = []
    for p in found:
        if p.zombie:
            _reap(p.pid)
            continue
        fd = _open(p, proc)
        if fd is None:
            continue
        if not _send(p.pid, fd, first, p, proc):
            if fd >= 0:
                os.close(fd)
            _reap(p.pid)
            continue
        signalled.append(p.pid)
        handles[p.pid] = (fd, p)
    _wait(handles, time.monotonic() + grace, proc, hurry)
    hard = sorted(handles)
    for pid, (fd, p) in handles.items():
        _send(pid, fd, signal.SIGKILL, p, proc)
    _wait(handles, time.monotonic() + 5.0, proc)
    for fd, _ in handles.values():
        if fd >= 0:
            os.close(fd)
    return signalled, (hard if first != signal.SIGKILL else [])
