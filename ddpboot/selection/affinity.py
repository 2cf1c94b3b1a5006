"""CPU cores for each rank: near its GPU (NVML's CPU affinity), split fairly, within what the launcher may use.

Pure functions over core sets; reading the launcher's own affinity (`os.sched_getaffinity`, which already
reflects cgroup cpusets and SLURM's binding) happens at the call site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ddpboot.errors import UsageError


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


CpuAffinity = Literal["auto", "none"] | CoreLists
"""`auto`: cores near each rank's GPU; `none`: no binding; or the user's core lists."""


def parse_cpu_affinity(text: str) -> CpuAffinity:
    """The --cpu-affinity value: `auto`, `none` (any case, blanks around) or core lists; syntax only."""
    mode = text.strip().lower()
    if mode in ("auto", "none"):
        return "auto" if mode == "auto" else "none"
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
    cores = assign_cores(near, allowed) if affinity == "auto" else explicit_cores(affinity, nranks, allowed)
    users: dict[int, int] = {}
    for cs in cores:
        for c in cs:
            users[c] = users.get(c, 0) + 1
    return cores, [max(1, sum(1 for c in cs if users[c] == 1)) for cs in cores]
