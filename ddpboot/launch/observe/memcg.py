"""What the kernel records about memory, read for the death observer (death.py): a process's memory cgroup (v2's
`memory.events` oom_kill, `memory.max`, `memory.peak`; v1's `memory.oom_control` oom_kill, `memory.limit_in_bytes`,
`memory.max_usage_in_bytes`), with the cgroups above it up to the hierarchy's root (a SLURM step's or a container's
limit is often set on a parent), the node's OOM kill count (/proc/vmstat) and the kernel log's `Killed process PID`
line (/dev/kmsg: root, or kernel.dmesg_restrict=0). Every reader answers None for what it cannot read."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ddpboot.procfs import PROC, cgroups

UNLIMITED = 1 << 62  # v1 writes "no limit" as a page-rounded 2^63 - 1
KMSG = Path("/dev/kmsg")
MAX_KMSG_RECORDS = 100_000  # the ring buffer is read once per death, at most this many records


@dataclass(frozen=True)
class Counters:
    """One memory cgroup's counters at one moment (None: not readable)."""

    name: str  # the cgroup's path in its hierarchy, "/slurm/uid_0/job_12/step_0"
    version: int  # 1 or 2
    oom_kills: int | None
    limit: int | None  # None: no limit
    peak: int | None  # the most it held (v2 memory.peak, v1 memory.max_usage_in_bytes)


@dataclass(frozen=True)
class MemoryCgroup:
    """Where a process's memory cgroup is on this machine."""

    name: str
    directory: Path
    root: Path  # the hierarchy's mount point: the ancestors are read up to it
    version: int

    def chain(self) -> list[tuple[str, Path]]:
        """The cgroup and every one above it, to the hierarchy's root (excluded: it holds no limit)."""
        out, name, here = [], self.name, self.directory
        while here != self.root and self.root in here.parents:
            out.append((name, here))
            here, name = here.parent, (name.rsplit("/", 1)[0] or "/")
        return out

    def read(self) -> list[Counters]:
        """The counters of the cgroup and of each one above it (the first is its own)."""
        return [_counters(name, d, self.version) for name, d in self.chain()]


def memory_cgroup(pid: int, proc: Path = PROC, mountinfo: Path = Path("/proc/self/mountinfo")) -> MemoryCgroup | None:
    """The memory cgroup of `pid` (None: gone, no memory controller mounted, or at a hierarchy's root)."""
    found = cgroups(pid, proc)
    if not found:
        return None
    mounts = _cgroup_mounts(mountinfo)
    for controllers, path in found:
        version = 2 if controllers == "" else 1
        if version == 1 and "memory" not in controllers.split(","):
            continue
        for point, root in mounts.get(version, []):
            rel = os.path.relpath(path, root) if path == root or path.startswith(root.rstrip("/") + "/") else None
            if rel is None or rel == ".":
                continue
            directory = Path(point) / rel
            if (directory / ("memory.max" if version == 2 else "memory.limit_in_bytes")).exists():
                return MemoryCgroup(path, directory, Path(point), version)
    return None


def _cgroup_mounts(mountinfo: Path) -> dict[int, list[tuple[str, str]]]:
    """version → (mount point, the cgroup mounted there) for v2 and v1's memory hierarchies."""
    out: dict[int, list[tuple[str, str]]] = {}
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        if after[0] == "cgroup2":
            out.setdefault(2, []).append((_unescape(fields[4]), _unescape(fields[3])))
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            out.setdefault(1, []).append((_unescape(fields[4]), _unescape(fields[3])))
    return out


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _counters(name: str, d: Path, version: int) -> Counters:
    if version == 2:
        return Counters(name, 2, _keyed(d / "memory.events", "oom_kill"), _number(d / "memory.max"),
                        _number(d / "memory.peak"))
    return Counters(name, 1, _keyed(d / "memory.oom_control", "oom_kill"), _number(d / "memory.limit_in_bytes"),
                    _number(d / "memory.max_usage_in_bytes"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _number(path: Path) -> int | None:
    text = _read(path)
    if text is None or text.strip() == "max":
        return None
    try:
        value = int(text.split()[0])
    except (IndexError, ValueError):
        return None
    return None if value >= UNLIMITED else value


def _keyed(path: Path, key: str) -> int | None:
    """`key N` from a flat keyed file (memory.events, memory.oom_control, /proc/vmstat)."""
    text = _read(path)
    for line in (text or "").splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key:
            with contextlib.suppress(ValueError):
                return int(words[1])
    return None


def node_oom_kills(proc: Path = PROC) -> int | None:
    """The kernel's OOM kills since boot, on the whole node (/proc/vmstat oom_kill)."""
    return _keyed(proc / "vmstat", "oom_kill")


def kernel_kill_line(pid: int, kmsg: Path = KMSG) -> tuple[str | None, str | None]:
    """The kernel log's last `Killed process PID (...)` line for `pid`, and why it could not be read (one of the
    two is None)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"the kernel log cannot be read ({kmsg}: {exc.strerror}; it needs root or dmesg_restrict=0)"
    found = None
    marker = f"Killed process {pid} "
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while read: go on with the next record
                    continue
                break
            text = record.decode(errors="replace")
            if marker in text:
                found = text.partition(";")[2].strip()
    finally:
        os.close(fd)
    return found, None
