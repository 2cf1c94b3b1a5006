"""CPU cores for each rank: near its GPU (NVML's CPU affinity), split fairly, within what the launcher may use.

Pure functions over core sets; reading the launcher's own affinity (`os.sched_getaffinity`, which already
reflects cgroup cpusets and SLURM's binding) happens at the call site.
"""

from __future__ import annotations

from collections.abc import Sequence

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
                if lo > hi or lo < 0:
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


def explicit_cores(text: str, nranks: int, allowed: Sequence[int]) -> list[tuple[int, ...]]:
    """`--cpu-affinity LIST`: `0-7` is a pool split among the ranks; `0-3;4-7` gives each rank its own list."""
    allowed_set = set(allowed)
    if ";" in text:
        per_rank = [parse_cpu_list(part) for part in text.split(";")]
        if len(per_rank) != nranks:
            raise UsageError(
                f"--cpu-affinity {text!r} gives {len(per_rank)} core lists for {nranks} ranks; give one per rank "
                "(separated by ';') or one pool to split (no ';')."
            )
    else:
        per_rank = split_fairly(parse_cpu_list(text), nranks)
    for cores in per_rank:
        bad = sorted(set(cores) - allowed_set)
        if bad:
            raise UsageError(
                f"--cpu-affinity {text!r} names cores {format_cpu_list(bad)}, which this launcher may not use "
                f"(allowed: {format_cpu_list(allowed)}, from its own CPU affinity / cgroup / SLURM binding)."
            )
        if not cores:
            raise UsageError(f"--cpu-affinity {text!r} leaves a rank without cores.")
    return [tuple(c) for c in per_rank]
