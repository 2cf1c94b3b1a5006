"""What the user asked for, parsed once at the command line's boundary into a typed Request.

Everything that the options alone decide is checked here: their syntax, their ranges, and the combinations that
contradict each other. Which GPUs the lists name, and whether they can be had, is the planner's business
(selection/planner.py), against an inventory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ddpboot.contract import Isolation
from ddpboot.errors import UsageError
from ddpboot.selection.affinity import CpuAffinity, parse_cpu_affinity
from ddpboot.selection.gpu_list import GpuList, parse_gpu_list
from ddpboot.units import parse_size

MIB = 1024**2
DEFAULT_MAX_USED_MEMORY = 256 * MIB
DEFAULT_MAX_UTIL = 5

NprocMode = Literal["gpu", "auto", "cpu"]
"""`gpu`: every allowed GPU, busy or not; `auto`: every free GPU (or one rank per core without GPUs); `cpu`: one
CPU rank per core."""
NPROC_MODES: tuple[NprocMode, ...] = ("gpu", "auto", "cpu")


@dataclass(frozen=True)
class Request:
    """What the user asked for (see `ddpboot plan --help`), every option parsed and checked: build it with
    `parse_request`."""

    nproc: int | NprocMode | None = None  # None: 1, or as many as --gpus names
    gpus: GpuList | None = None
    exclude: GpuList | None = None
    gpus_per_proc: int = 1
    isolation: Isolation = Isolation.RANK
    cpu: bool = False
    max_used_memory: int = DEFAULT_MAX_USED_MEMORY
    max_util: int = DEFAULT_MAX_UTIL
    nnodes: int = 1
    node_rank: int = 0
    cpu_affinity: CpuAffinity = "auto"
    share: bool = False  # use GPUs named in --gpus even when another ddpboot job holds their lock


def parse_nproc(value: str | None) -> int | NprocMode | None:
    """`--nproc`: a count of at least 1, or a mode (any case); None when not given."""
    if value is None:
        return None
    text = value.strip().lower()
    for mode in NPROC_MODES:
        if text == mode:
            return mode
    if re.fullmatch(r"[+-]?\d+", text):
        n = int(text)
        if n < 1:
            raise UsageError(f"--nproc {value}: the number of processes must be at least 1.")
        return n
    raise UsageError(f"--nproc {value!r} is not a process count. Give a number, or gpu, auto or cpu.")


def parse_isolation(value: str | Isolation) -> Isolation:
    """`--isolation`: a mode's name (any case)."""
    if isinstance(value, Isolation):
        return value
    try:
        return Isolation.parse(value)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _check_counts(gpus_per_proc: int, nnodes: int, node_rank: int) -> None:
    if gpus_per_proc < 1:
        raise UsageError(f"--gpus-per-proc {gpus_per_proc}: each process needs at least 1 GPU.")
    if nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: at least 1 node.")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank} is outside 0..{nnodes - 1} (--nnodes {nnodes}).")


def _check_combination(nproc: int | NprocMode | None, gpus: str | None, cpu: bool) -> None:
    """Options that contradict each other, whatever the machine has."""
    if cpu and gpus is not None:
        raise UsageError("--cpu and --gpus contradict each other: choose CPU ranks or GPUs.")
    if cpu and nproc == "gpu":
        raise UsageError("--cpu with --nproc gpu: give a number of CPU ranks (or --nproc cpu).")
    if nproc == "cpu" and gpus is not None:
        raise UsageError("--nproc cpu and --gpus contradict each other: choose CPU ranks or GPUs.")
    if nproc == "auto" and gpus is not None:
        raise UsageError("--nproc auto chooses GPUs itself; with --gpus, leave --nproc out.")


def parse_request(
    *,
    nproc: str | None = None,
    gpus: str | None = None,
    exclude: str | None = None,
    gpus_per_proc: int = 1,
    isolation: str | Isolation = Isolation.RANK,
    cpu: bool = False,
    max_used_memory: int = DEFAULT_MAX_USED_MEMORY,
    max_util: int = DEFAULT_MAX_UTIL,
    nnodes: int = 1,
    node_rank: int = 0,
    cpu_affinity: str = "auto",
    share: bool = False,
) -> Request:
    """The Request for these option values (as typed on the command line); raises UsageError for bad syntax or
    options that contradict each other. An empty --gpus or --exclude counts as not given."""
    mode = parse_isolation(isolation)
    _check_counts(gpus_per_proc, nnodes, node_rank)
    count = parse_nproc(nproc)
    excluded = parse_gpu_list(exclude, "--exclude") if exclude else None
    _check_combination(count, gpus or None, cpu)
    return Request(
        nproc=count,
        gpus=parse_gpu_list(gpus, "--gpus") if gpus else None,
        exclude=excluded,
        gpus_per_proc=gpus_per_proc,
        isolation=mode,
        cpu=cpu,
        max_used_memory=max_used_memory,
        max_util=max_util,
        nnodes=nnodes,
        node_rank=node_rank,
        cpu_affinity=parse_cpu_affinity(cpu_affinity),
        share=share,
    )


@dataclass(frozen=True)
class SelectionOptions:
    """The GPU-selection options as typed (strings and flags, the command line's defaults): one declaration that
    the command line, `plan`, `gpus`, `smoke` and the pytest plugin fill in, and `parse_selection` turns into a
    Request. Node count and node rank are not here: they come from the node setup (nodes/launcher.py)."""

    nproc: str | None = None
    gpus: str | None = None
    exclude: str | None = None
    gpus_per_proc: int = 1
    isolation: str = Isolation.RANK.value
    cpu: bool = False
    max_used_memory: str = "256MiB"
    max_util: int = DEFAULT_MAX_UTIL
    cpu_affinity: str = "auto"
    share: bool = False
    oversubscribe: bool = False  # more ranks than RANKS_PER_CORE per core (launch/preflight.py checks the count)


def parse_selection(options: SelectionOptions, nnodes: int = 1, node_rank: int = 0) -> Request:
    """The Request for these options on node `node_rank` of `nnodes`; UsageError for anything wrong."""
    if options.gpus is not None and not options.gpus.strip():
        raise UsageError("--gpus '': the list is empty, so it names no GPU. Name GPUs (--gpus 0,1), leave --gpus "
                         "out to let ddpboot choose free ones, or use --cpu for CPU ranks.")
    if not 0 <= options.max_util <= 100:
        raise UsageError(f"--max-util {options.max_util}: give a percentage between 0 and 100.")
    return parse_request(
        nproc=options.nproc,
        gpus=options.gpus,
        exclude=options.exclude,
        gpus_per_proc=options.gpus_per_proc,
        isolation=options.isolation,
        cpu=options.cpu,
        max_used_memory=parse_size(options.max_used_memory, "--max-used-memory"),
        max_util=options.max_util,
        nnodes=nnodes,
        node_rank=node_rank,
        cpu_affinity=options.cpu_affinity,
        share=options.share,
    )
