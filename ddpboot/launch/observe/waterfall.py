"""The start-up waterfall, pure: each rank's marks (launch/pymain.py record_phases: `up`, `torch`, `cuda_start`,
`cuda`, `pg_start`, `pg`; the launcher's exec and the rank's first output after its process group) in, its phases'
durations out; and the one rank that lost noticeably more than the others in one phase of its own work (LOSS_MIN
seconds more than every other rank's same phase, and LOSS_RATIO times as long), as the `ddpboot: start-up` line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PHASES = ("python", "imports", "cuda", "nccl", "setup", "rendezvous", "first_output")
"""In their order: the interpreter's start (exec → the bootstrap's first line), the imports up to torch's end, the
first CUDA context, NCCL's communicator init (from NCCL's own timing), the script's own work until it called
init_process_group, init_process_group (waiting for the others and the store), then until its first output."""
OWN = ("python", "imports", "cuda", "nccl", "setup")  # the rank's own work: a rank waits for the others only after
LOSS_MIN = 2.0  # seconds more than every other rank's same phase ...
LOSS_RATIO = 1.5  # ... and this many times as long, for the start-up line


def phases(exec_at: float, marks: Mapping[str, float], first_output: float | None = None,
           nccl: float | None = None) -> dict[str, float]:
    """A rank's phases, seconds each, as far as its marks go (unix times; `nccl`: NCCL's init, in seconds)."""
    out: dict[str, float] = {}

    def span(name: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None:
            out[name] = max(0.0, end - start)

    up, torch, pg_start, pg = (marks.get(k) for k in ("up", "torch", "pg_start", "pg"))
    span("python", exec_at, up)
    span("imports", up, torch)
    span("cuda", marks.get("cuda_start"), marks.get("cuda"))
    if nccl is not None:
        out["nccl"] = nccl
    before_pg = out.get("cuda", 0.0) if _between(marks.get("cuda_start"), torch, pg_start) else 0.0
    span("setup", torch, None if pg_start is None else pg_start - before_pg)
    span("rendezvous", pg_start, pg)
    span("first_output", pg, first_output)
    return {k: round(out[k], 3) for k in PHASES if k in out}


def current_phase(marks: Mapping[str, float]) -> str | None:
    """The phase a started rank is in now, from its marks so far (None: its process group is up)."""
    if "pg" in marks:
        return None
    if "pg_start" in marks:
        return "rendezvous"
    if "cuda_start" in marks and "cuda" not in marks:
        return "cuda"
    if "torch" in marks:
        return "setup"
    return "imports" if "up" in marks else "python"


def _between(t: float | None, start: float | None, end: float | None) -> bool:
    return t is not None and start is not None and end is not None and start <= t <= end


@dataclass(frozen=True)
class Slowest:
    rank: int
    phase: str
    took: float
    others: float  # the most any other rank took in that phase


def slowest(table: Mapping[int, Mapping[str, float]]) -> Slowest | None:
    """The rank and phase of its own work that lost the most against every other rank, when that loss is
    noticeable (LOSS_MIN, LOSS_RATIO); None when no rank lost noticeably more, or there is no other rank."""
    best: Slowest | None = None
    for phase in OWN:
        have = {r: p[phase] for r, p in table.items() if phase in p}
        if len(have) < 2:
            continue
        for rank, took in have.items():
            others = max(t for r, t in have.items() if r != rank)
            if took - others >= LOSS_MIN and took >= LOSS_RATIO * others and (
                    best is None or took - others > best.took - best.others):
                best = Slowest(rank, phase, took, others)
    return best


def startup_line(slow: Slowest, total: float, node: int | None = None) -> str:
    where = f" (node {node})" if node is not None else ""
    return (f"ddpboot: start-up {total:.1f} s: slowest rank {slow.rank}{where}: {slow.phase} {slow.took:.1f} s "
            f"(the others at most {slow.others:.1f} s)")
