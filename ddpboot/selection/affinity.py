"""CPU cores for each rank: near its GPU (NVML's CPU affinity), split fairly, within what the launcher may use; or
torchrun's NUMA policies (`--numa-binding`), for each rank's own GPU.

Pure functions over core sets; reading the launcher's own affinity (`os.sched_getaffinity`, which already
reflects cgroup cpusets and SLURM's binding) happens at the call site. The NUMA policies also need the machine's CPU
topology (each CPU's NUMA node, socket, physical core and last-level cache), read from sysfs once, when one is asked
for (`Topology.read`).

The policies, as torch's `torch/numa/binding.py` defines them, but for the rank's own GPU (torchrun takes GPU N for
local rank N; ddpboot knows which GPU each rank got): the GPU's NUMA node is the one of the cores near it (NVML's
CPU affinity; none known: an error). `node`: every allowed CPU of that node; `socket`: of every node of its socket;
`exclusive`: the node's physical cores (hyperthreads kept together) divided among this node's ranks whose GPUs are
there, lower GPUs getting the extra core (fewer cores than ranks: an error); `core-complex`: one last-level cache's
CPUs of the node each, a different cache per rank while there are enough, fuller caches first. torch divides
`exclusive` and `core-complex` among every GPU of the node, used or not; ddpboot among the job's ranks there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ddpboot.errors import UsageError
from ddpboot.units import OptionChoice


def parse_cpu_list(text: str, option: str = "--cpu-affinity") -> tuple[int, ...]:
    """`0-3,8,10-11` → (0, 1, 2, 3, 8, 10, 11); ranges inclusive, the order kept, duplicates refused."""
    out: list[int] = []
    for raw in text.split(","):
        tok = raw.strip()
        try:
            if "-" in tok:
                lo_s, hi_s = tok.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo > hi >= 0:
                    raise UsageError(
                        f"{option} {text!r}: the range {tok!r} runs backwards. Write it low to high: {hi}-{lo}."
                    )
                if lo < 0:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                n = int(tok)
                if n < 0:
                    raise ValueError
                out.append(n)
        except ValueError:
            raise UsageError(
                f"{option} {text!r}: {tok!r} is not a core number or range. Write cores like 0-7,16-23."
            ) from None
    if len(set(out)) != len(out):
        raise UsageError(f"{option} {text!r} names a core more than once.")
    return tuple(out)


def format_cpu_list(cpus: Sequence[int]) -> str:
    """(0, 1, 2, 3, 8) → '0-3,8'."""
    parts: list[str] = []
    cs = sorted(cpus)
    i = 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        parts.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(parts)


def split_fairly(cores: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """n contiguous chunks whose sizes differ by at most one; with fewer cores than n, chunks share cores."""
    cs = sorted(cores)
    if n <= 0:
        return []
    if len(cs) < n:
        return [(cs[i % len(cs)],) for i in range(n)] if cs else [() for _ in range(n)]
    base, extra = divmod(len(cs), n)
    out, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(tuple(cs[start : start + size]))
        start += size
    return out


def assign_cores(
    near: Sequence[tuple[int, ...]],
    allowed: Sequence[int],
) -> list[tuple[int, ...]]:
    """Cores per rank. `near[r]` is the cores close to rank r's GPUs (empty: unknown, e.g. a CPU rank).

    Ranks whose GPUs are near the same cores share those cores (within `allowed`) in fair contiguous chunks;
    a rank with nothing near it that it may use shares the allowed cores left over (or all of them) with the others
    in the same position.
    """
    allowed_set = set(allowed)
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, cores in enumerate(near):
        usable = tuple(sorted(set(cores) & allowed_set))
        groups.setdefault(usable, []).append(rank)
    out: list[tuple[int, ...]] = [() for _ in near]
    claimed = {c for key in groups if key for c in key}
    for key, ranks in groups.items():
        pool = key or tuple(sorted(allowed_set - claimed)) or tuple(sorted(allowed_set))
        for rank, chunk in zip(ranks, split_fairly(pool, len(ranks)), strict=True):
            out[rank] = chunk
    return out


@dataclass(frozen=True)
class CoreLists:
    """`--cpu-affinity LIST`: `0-7` is one pool split among the ranks; `0-3;4-7` gives each rank its own list."""

    text: str  # as the user wrote it, for messages
    lists: tuple[tuple[int, ...], ...]
    per_rank: bool


class NumaBinding(OptionChoice):
    """torchrun's NUMA policies (`--numa-binding`; the module docstring says what each binds)."""

    NODE = "node"
    SOCKET = "socket"
    EXCLUSIVE = "exclusive"
    CORE_COMPLEX = "core-complex"

    @classmethod
    def refusal(cls, text: str | None, where: str) -> str:
        return (f"{where} {text}: choose {cls.listing()} (torchrun's policies), or give each rank's cores yourself "
                "with --cpu-affinity LIST.")


@dataclass(frozen=True)
class NumaPolicy:
    """One of torchrun's NUMA policies (NumaBinding's words), as --cpu-affinity or --numa-binding gave it."""

    mode: str


CpuAffinity = Literal["auto", "none"] | CoreLists | NumaPolicy
"""`auto`: cores near each rank's GPU; `none`: no binding; the user's core lists; or a NUMA policy."""


def parse_cpu_affinity(text: str) -> CpuAffinity:
    """The --cpu-affinity value: `auto`, `none`, a NUMA policy (any case, blanks around) or core lists; syntax
    only."""
    mode = text.strip().lower()
    if mode in ("auto", "none"):
        return "auto" if mode == "auto" else "none"
    if mode in NumaBinding.values():
        return NumaPolicy(mode)
    if ";" in text:
        return CoreLists(text, tuple(parse_cpu_list(part) for part in text.split(";")), per_rank=True)
    return CoreLists(text, (parse_cpu_list(text),), per_rank=False)


def explicit_cores(spec: CoreLists, nranks: int, allowed: Sequence[int]) -> list[tuple[int, ...]]:
    """Each rank's cores from the user's lists, all of them within `allowed`. None is empty: a parsed list never is,
    and a pool split among more ranks than it has cores gives them shared cores."""
    text = spec.text
    if not spec.per_rank:
        per_rank = split_fairly(spec.lists[0], nranks)
    elif len(spec.lists) != nranks:
        raise UsageError(
            f"--cpu-affinity {text!r} gives {len(spec.lists)} core lists for {nranks} ranks; give one per rank "
            "(separated by ';') or one pool to split (no ';')."
        )
    else:
        per_rank = list(spec.lists)
    allowed_set = set(allowed)
    for cores in per_rank:
        bad = sorted(set(cores) - allowed_set)
        if bad:
            raise UsageError(
                f"--cpu-affinity {text!r} names cores {format_cpu_list(bad)}, which this launcher may not use "
                f"(allowed: {format_cpu_list(allowed)}, from its own CPU affinity / cgroup / SLURM binding)."
            )
    return per_rank


def rank_cores(
    affinity: CpuAffinity, near: Sequence[tuple[int, ...]], allowed: Sequence[int]
) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each rank's cores (empty: not bound) and its OMP_NUM_THREADS share. `near[r]`: the cores near rank r's GPUs.

    A rank's share is the cores it has to itself; ranks that had to share cores (more ranks than cores) get one
    thread each. Unbound ranks (`none`) share the allowed cores evenly.
    """
    nranks = len(near)
    if affinity == "none":
        return [() for _ in near], [max(1, len(allowed) // max(nranks, 1))] * nranks
    if isinstance(affinity, NumaPolicy):
        cores = numa_cores(affinity, near, allowed, Topology.read())
    elif affinity == "auto":
        cores = assign_cores(near, allowed)
    else:
        cores = explicit_cores(affinity, nranks, allowed)
    users: dict[int, int] = {}
    for cs in cores:
        for c in cs:
            users[c] = users.get(c, 0) + 1
    return cores, [max(1, sum(1 for c in cs if users[c] == 1)) for cs in cores]


def memory_nodes(affinity: CpuAffinity, cores: Sequence[tuple[int, ...]],
                 topo: Topology | None = None) -> list[tuple[int, ...]]:
    """Each rank's NUMA nodes to prefer memory from: under a NUMA policy the nodes of its cores, else none."""
    if not isinstance(affinity, NumaPolicy):
        return [() for _ in cores]
    topo = topo if topo is not None else Topology.read()
    return [tuple(sorted({topo.node.get(c, 0) for c in cs})) for cs in cores]


def _cpu_set(text: str) -> set[int]:
    """A sysfs CPU list (`0-3,8`, perhaps empty) as a set."""
    return set(parse_cpu_list(text.strip(), "sysfs")) if text.strip() else set()


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text()
    return None


@dataclass(frozen=True)
class Topology:
    """Each logical CPU's NUMA node, socket, physical core and last-level cache, each named by a number (a core and
    a cache by their lowest CPU). What sysfs does not say counts as one node, one socket, a core per CPU."""

    node: Mapping[int, int]
    socket: Mapping[int, int]
    core: Mapping[int, int]
    cache: Mapping[int, int]

    @classmethod
    def read(cls, root: Path = Path("/sys/devices/system")) -> Topology:
        node: dict[int, int] = {}
        for path in sorted(root.glob("node/node[0-9]*")):
            for cpu in _cpu_set(_read(path / "cpulist") or ""):
                node[cpu] = int(path.name[4:])
        socket, core, cache = {}, {}, {}
        for path in root.glob("cpu/cpu[0-9]*"):
            cpu = int(path.name[3:])
            socket[cpu] = int((_read(path / "topology/physical_package_id") or "0").strip() or 0)
            core[cpu] = min(_cpu_set(_read(path / "topology/thread_siblings_list") or "") or {cpu})
            cache[cpu] = min(_last_level_cache(path / "cache") or {cpu})
        return cls(node, socket, core, cache)


def _last_level_cache(path: Path) -> set[int]:
    """The CPUs sharing this CPU's highest-level data (or unified) cache, as torch reads it."""
    best, cpus = -1, set()
    for index in path.glob("index[0-9]*"):
        kind, level = (_read(index / "type") or "").strip(), (_read(index / "level") or "").strip()
        if kind in ("Unified", "Data") and level.isdigit() and int(level) > best:
            best, cpus = int(level), _cpu_set(_read(index / "shared_cpu_list") or "")
    return cpus


def numa_cores(policy: NumaPolicy, near: Sequence[tuple[int, ...]], allowed: Sequence[int],
               topo: Topology) -> list[tuple[int, ...]]:
    """Each rank's cores under a NUMA policy (the module docstring). `near[r]`: the cores near rank r's GPUs."""
    allowed_set = set(allowed)
    nodes = [_gpu_nodes(policy, r, cores, topo) for r, cores in enumerate(near)]
    out = []
    for rank, own in enumerate(nodes):
        pool = {c for c in allowed_set if topo.node.get(c, 0) in own}
        if policy.mode == "socket":
            sockets = {topo.socket.get(c, 0) for c in pool}
            pool = {c for c in allowed_set if topo.socket.get(c, 0) in sockets}
        peers = [r for r, n in enumerate(nodes) if n == own]  # this node's ranks, in GPU order
        if policy.mode == "exclusive":
            pool = _exclusive(pool, peers.index(rank), len(peers), topo, policy)
        elif policy.mode == "core-complex":
            caches = _group(pool, topo.cache)
            caches.sort(key=lambda cs: (-len(cs), min(cs)))
            pool = set(caches[peers.index(rank) % len(caches)]) if caches else pool
        if not pool:
            raise UsageError(f"--numa-binding {policy.mode}: rank {rank}'s NUMA node has no core this launcher may "
                             f"use (allowed: {format_cpu_list(allowed)}). Use --cpu-affinity LIST.")
        out.append(tuple(sorted(pool)))
    return out


def _gpu_nodes(policy: NumaPolicy, rank: int, cores: tuple[int, ...], topo: Topology) -> frozenset[int]:
    if not cores:
        raise UsageError(f"--numa-binding {policy.mode}: rank {rank} has no GPU whose NUMA node ddpboot knows (a CPU "
                         "rank, or NVML gave no CPU affinity for its GPU). Bind it with --cpu-affinity LIST, or drop "
                         "--numa-binding.")
    return frozenset(topo.node.get(c, 0) for c in cores)


def _group(cpus: set[int], key: Mapping[int, int]) -> list[list[int]]:
    """The CPUs grouped by `key` (a core, a cache), each group sorted, the groups in order of their key."""
    groups: dict[int, list[int]] = {}
    for c in sorted(cpus):
        groups.setdefault(key.get(c, c), []).append(c)
    return [groups[k] for k in sorted(groups)]


def _exclusive(pool: set[int], index: int, count: int, topo: Topology, policy: NumaPolicy) -> set[int]:
    """The index-th of `count` shares of the pool's physical cores (whole cores; the first shares one more)."""
    cores = _group(pool, topo.core)
    if len(cores) < count:
        raise UsageError(f"--numa-binding {policy.mode}: {count} ranks' GPUs are on one NUMA node with only "
                         f"{len(cores)} physical cores for them (CPUs {format_cpu_list(sorted(pool))}). Use "
                         "--numa-binding node, or fewer ranks.")
    base, extra = divmod(len(cores), count)
    start = index * base + min(index, extra)
    return {c for core in cores[start:start + base + (1 if index < extra else 0)] for c in core}
