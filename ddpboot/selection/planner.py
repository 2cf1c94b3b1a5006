"""Request + Inventory + Visible → Plan: which GPUs each local rank gets. A pure function; nothing is started here.

Indices on the command line are physical (NVML / nvidia-smi) indices, whatever CUDA_VISIBLE_DEVICES says; inside
an inherited CUDA_VISIBLE_DEVICES they must still name a GPU that it allows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpboot.contract import ISOLATIONS
from ddpboot.errors import PlanError, UsageError
from ddpboot.selection.affinity import assign_cores, explicit_cores
from ddpboot.selection.inventory import GPU, Inventory
from ddpboot.selection.visible import Visible, match_uuid, resolve_visible
from ddpboot.units import format_size, plural

MIB = 1024**2
DEFAULT_MAX_USED_MEMORY = 256 * MIB
DEFAULT_MAX_UTIL = 5

_INT = re.compile(r"^\d+$")
_RANGE = re.compile(r"^(\d+)-(\d+)$")
_MIG = re.compile(r"^(\d+):(\d+)$")
_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")


@dataclass(frozen=True)
class Request:
    """What the user asked for (parsed from options; see `ddpboot plan --help`)."""

    nproc: str | None = None  # "N", "gpu", "auto", "cpu" or None (1, or as many as --gpus names)
    gpus: str | None = None
    exclude: str | None = None
    gpus_per_proc: int = 1
    isolation: str = "rank"
    cpu: bool = False
    max_used_memory: int = DEFAULT_MAX_USED_MEMORY
    max_util: int = DEFAULT_MAX_UTIL
    nnodes: int = 1
    node_rank: int = 0
    cpu_affinity: str = "auto"  # "auto" (near each rank's GPU), "none", or a core list
    share: bool = False  # use GPUs named in --gpus even when another ddpboot job holds their lock


@dataclass(frozen=True)
class RankSlot:
    rank: int
    local_rank: int
    gpus: tuple[GPU, ...]
    cuda_visible_devices: str
    device: str  # what the worker should use: "cuda:0", "cuda:3" (node isolation) or "cpu"
    cpus: tuple[int, ...] = ()  # the cores the worker is bound to; empty: not bound
    omp_threads: int = 1  # OMP_NUM_THREADS when the user has not set it: the rank's share of the cores

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "cuda_visible_devices": self.cuda_visible_devices,
            "device": self.device,
            "cpus": list(self.cpus),
            "omp_threads": self.omp_threads,
            "gpus": [g.to_json() for g in self.gpus],
        }


@dataclass(frozen=True)
class Plan:
    ranks: tuple[RankSlot, ...]
    world_size: int
    nnodes: int
    node_rank: int
    isolation: str
    backend: str
    notes: tuple[str, ...] = ()
    inventory_source: str = "none"
    visible: str = "all GPUs"
    cluster: dict[str, Any] = field(default_factory=dict)

    @property
    def local_world_size(self) -> int:
        return len(self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "local_world_size": self.local_world_size,
            "isolation": self.isolation,
            "backend": self.backend,
            "inventory": self.inventory_source,
            "visible": self.visible,
            "ranks": [r.to_json() for r in self.ranks],
            "notes": list(self.notes),
        }


# --- user lists ------------------------------------------------------------------------------------


def parse_gpu_list(text: str, option: str) -> tuple[str, ...]:
    """Split a GPU list (`0,2-3`, `GPU-5f1c`, `0000:18:00.0`, `1:0`) into tokens, expanding ranges; syntax only."""
    tokens: list[str] = []
    if text.strip() == "":
        raise UsageError(
            f"{option} is empty. Give GPUs as indices (0,2), ranges (0-3), UUIDs (GPU-5f1c...) or PCI bus ids."
        )
    for i, raw in enumerate(text.split(",")):
        tok = raw.strip()
        where = f"{option} {text!r}: entry {i + 1}"
        if tok == "":
            raise UsageError(f"{where} is empty (two commas in a row, or a trailing comma). Write e.g. {option} 1,2.")
        m = _RANGE.match(tok)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise UsageError(f"{where}: the range {tok!r} runs backwards; write {hi}-{lo}.")
            tokens.extend(str(x) for x in range(lo, hi + 1))
        elif _INT.match(tok) or _MIG.match(tok) or _BUS.match(tok) or _UUID.match(tok):
            tokens.append(tok)
        else:
            raise UsageError(
                f"{where}: {tok!r} is not a GPU. Use an index (3), a range (0-3), a MIG instance (3:1), a UUID or "
                "its prefix (GPU-5f1c, MIG-...), or a PCI bus id (0000:18:00.0)."
            )
    return tuple(tokens)


def _norm_bus(text: str) -> tuple[int, int, int, int] | None:
    m = _BUS.match(text)
    if not m:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))


def _gpu_range(inventory: Inventory) -> str:
    if not inventory.gpus:
        return "this machine has no GPUs"
    labels = [g.label for g in inventory.gpus]
    return f"this machine has {len(labels)} GPU{'s' if len(labels) != 1 else ''}: {', '.join(labels)}"


def resolve_token(tok: str, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    """The unit(s) a token names; a MIG-enabled GPU named by index or UUID means all its instances."""
    units = inventory.units()
    if _INT.match(tok):
        hits = [g for g in inventory.gpus if g.index == int(tok)]
        if not hits:
            raise PlanError(
                f"{option}: GPU {tok} does not exist; {_gpu_range(inventory)}. Run `ddpboot gpus` to see them."
            )
        gpu = hits[0]
        return gpu.mig_devices if gpu.mig_enabled else (gpu,)
    m = _MIG.match(tok)
    if m:
        hits = [u for u in units if u.index == int(m.group(1)) and u.mig_index == int(m.group(2))]
        if not hits:
            migs = ", ".join(u.label for u in units if u.mig_index is not None) or "none"
            raise PlanError(f"{option}: MIG instance {tok} does not exist; MIG instances here: {migs}.")
        return (hits[0],)
    bus = _norm_bus(tok)
    if bus is not None:
        hits = [g for g in inventory.gpus if _norm_bus(g.pci_bus_id) == bus]
        if not hits:
            known = ", ".join(f"{g.index}={g.pci_bus_id}" for g in inventory.gpus) or "none"
            raise PlanError(f"{option}: no GPU has PCI bus id {tok}; bus ids here: {known}.")
        gpu = hits[0]
        return gpu.mig_devices if gpu.mig_enabled else (gpu,)
    whole = match_uuid(tok, inventory.gpus, option) if tok.startswith("GPU-") else None
    unit = whole or match_uuid(tok, units, option)
    if unit is None:
        raise PlanError(
            f"{option}: no GPU has a UUID starting with {tok!r}; {_gpu_range(inventory)}. "
            "`ddpboot gpus` lists their UUIDs."
        )
    return unit.mig_devices if unit.mig_enabled else (unit,)


def resolve_list(text: str, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    out: list[GPU] = []
    for tok in parse_gpu_list(text, option):
        for unit in resolve_token(tok, inventory, option):
            if any(u.uuid == unit.uuid for u in out):
                raise UsageError(f"{option} {text!r} names GPU {unit.label} more than once. List each GPU once.")
            out.append(unit)
    return tuple(out)


# --- busy ------------------------------------------------------------------------------------------


def busy_reasons(gpu: GPU, req: Request, locked: Mapping[str, str] | None = None) -> list[str]:
    """Why automatic selection would not pick this GPU (empty: it is free). `locked`: uuid → holder."""
    reasons = []
    if locked and gpu.uuid in locked:
        reasons.append(f"locked by {locked[gpu.uuid]}")
    if gpu.memory_used > req.max_used_memory:
        reasons.append(f"{format_size(gpu.memory_used)} used > {format_size(req.max_used_memory)}")
    if gpu.utilization is not None and gpu.utilization > req.max_util:
        reasons.append(f"{gpu.utilization}% busy > {req.max_util}%")
    if gpu.processes:
        reasons.append(f"{len(gpu.processes)} process{'es' if len(gpu.processes) > 1 else ''} running")
    return reasons


# --- the planner -----------------------------------------------------------------------------------


def parse_nproc(value: str | None) -> int | str | None:
    if value is None:
        return None
    text = value.strip().lower()
    if text in ("gpu", "auto", "cpu"):
        return text
    if re.fullmatch(r"[+-]?\d+", text):
        n = int(text)
        if n < 1:
            raise UsageError(f"--nproc {value}: the number of processes must be at least 1.")
        return n
    raise UsageError(f"--nproc {value!r} is not a process count. Give a number, or gpu, auto or cpu.")


def make_plan(
    req: Request,
    inventory: Inventory,
    env: Mapping[str, str],
    cpu_count: int | None = None,
    allowed_cpus: Sequence[int] | None = None,
    locked: Mapping[str, str] | None = None,
) -> Plan:
    """The rank → GPU map for this node. Pure: every input is an argument.

    `allowed_cpus` are the cores the launcher may use (its own affinity); `cpu_count` defaults to their number.
    `locked` maps the UUIDs of GPUs that other ddpboot jobs hold to a description of the holder.
    """
    locked = locked or {}
    allowed = tuple(allowed_cpus) if allowed_cpus is not None else tuple(range(cpu_count or 1))
    cpu_count = len(allowed) if cpu_count is None else cpu_count
    if req.isolation not in ISOLATIONS:
        raise UsageError(
            f"--isolation {req.isolation!r}: choose rank (one GPU set per worker) or node (all, as torchrun)."
        )
    if req.gpus_per_proc < 1:
        raise UsageError(f"--gpus-per-proc {req.gpus_per_proc}: each process needs at least 1 GPU.")
    if req.nnodes < 1:
        raise UsageError(f"--nnodes {req.nnodes}: at least 1 node.")
    if not 0 <= req.node_rank < req.nnodes:
        raise UsageError(f"--node-rank {req.node_rank} is outside 0..{req.nnodes - 1} (--nnodes {req.nnodes}).")
    nproc = parse_nproc(req.nproc)
    k = req.gpus_per_proc
    visible = resolve_visible(inventory, env)
    notes = list(inventory.notes) + list(visible.notes)
    excluded = resolve_list(req.exclude, inventory, "--exclude") if req.exclude else ()
    is_excluded = {u.uuid for u in excluded}

    def cpu_plan(n: int, why: str) -> Plan:
        if k != 1:
            raise UsageError(f"--gpus-per-proc {k} needs GPUs, but {why}.")
        notes.append(f"{n} CPU rank{'s' if n != 1 else ''} (gloo): {why}")
        return _build(req, [() for _ in range(n)], "gloo", notes, inventory, visible, allowed)

    if req.cpu:
        if req.gpus:
            raise UsageError("--cpu and --gpus contradict each other: choose CPU ranks or GPUs.")
        if nproc == "gpu":
            raise UsageError("--cpu with --nproc gpu: give a number of CPU ranks (or --nproc cpu).")
        n = nproc if isinstance(nproc, int) else (cpu_count if nproc in ("cpu", "auto") else 1)
        return cpu_plan(n, "--cpu asked for CPU ranks")
    if nproc == "cpu":
        if req.gpus:
            raise UsageError("--nproc cpu and --gpus contradict each other: choose CPU ranks or GPUs.")
        return cpu_plan(cpu_count, "--nproc cpu asked for one CPU rank per core")

    if req.gpus:
        chosen = resolve_list(req.gpus, inventory, "--gpus")
        for unit in chosen:
            if unit.uuid in is_excluded:
                raise UsageError(
                    f"GPU {unit.label} is both listed in --gpus {req.gpus} and excluded by --exclude {req.exclude}. "
                    "Remove it from one of the two."
                )
            if not visible.allows(unit):
                raise PlanError(
                    f"--gpus {req.gpus}: GPU {unit.label} is not visible to this process ({visible.describe()}). "
                    "Indices on the command line are physical (nvidia-smi) indices and must name a GPU that the "
                    "inherited CUDA_VISIBLE_DEVICES allows; pick among those, or unset CUDA_VISIBLE_DEVICES."
                )
        if len(chosen) % k:
            raise UsageError(f"--gpus {req.gpus} names {len(chosen)} GPUs, which --gpus-per-proc {k} does not divide.")
        if isinstance(nproc, int) and nproc * k != len(chosen):
            raise UsageError(
                f"--nproc {nproc} × --gpus-per-proc {k} needs {nproc * k} GPUs but --gpus {req.gpus} names "
                f"{len(chosen)}. Drop --nproc (it defaults to the number of GPUs listed) or list {nproc * k}."
            )
        if nproc in ("auto",):
            raise UsageError("--nproc auto chooses GPUs itself; with --gpus, leave --nproc out.")
        for unit in chosen:
            if unit.uuid in locked and not req.share:
                raise PlanError(
                    f"--gpus {req.gpus}: GPU {unit.label} is locked by another ddpboot job: {locked[unit.uuid]}. "
                    "Choose other GPUs, wait for it (--wait-for-gpus), or use it anyway with --share."
                )
            reasons = busy_reasons(unit, req, locked)
            if reasons:
                notes.append(f"GPU {unit.label} is busy ({'; '.join(reasons)}) but was asked for explicitly")
        groups = [tuple(chosen[i : i + k]) for i in range(0, len(chosen), k)]
        return _build(req, groups, "nccl", notes, inventory, visible, allowed)

    candidates = [u for u in visible.units if u.uuid not in is_excluded]
    wants_gpu = nproc == "gpu" or k > 1
    if not inventory.gpus:
        if wants_gpu:
            raise PlanError(
                f"{'--nproc gpu' if nproc == 'gpu' else f'--gpus-per-proc {k}'} asks for GPUs, but this machine has "
                f"none ({'; '.join(inventory.notes) or 'the inventory is empty'}). Use --nproc N for CPU ranks."
            )
        n = cpu_count if nproc == "auto" else (nproc if isinstance(nproc, int) else 1)
        return cpu_plan(n, "this machine has no GPUs")
    if not candidates:
        if visible.restricted and not visible.units:
            if wants_gpu:
                raise PlanError(
                    f"{visible.describe()}: it hides every GPU, yet GPUs were asked for. Unset CUDA_VISIBLE_DEVICES "
                    "or set it to the GPUs this job may use."
                )
            n = cpu_count if nproc == "auto" else (nproc if isinstance(nproc, int) else 1)
            return cpu_plan(n, f"CUDA_VISIBLE_DEVICES={visible.raw!r} hides every GPU")
        raise PlanError(
            f"--exclude {req.exclude} leaves no GPU to run on: {_gpu_range(inventory)}"
            + (f" and {visible.describe()}" if visible.restricted else "")
            + ". Exclude fewer GPUs."
        )

    # `gpu` means every allowed GPU, busy or not (e.g. those a SLURM job was given); otherwise only free ones.
    pool = (
        [u for u in candidates if u.uuid not in locked]
        if nproc == "gpu"
        else [u for u in candidates if not busy_reasons(u, req, locked)]
    )
    if nproc == "gpu" or nproc == "auto":
        n = len(pool) // k
        if n == 0:
            raise PlanError(_shortage(1, k, pool, candidates, excluded, visible, inventory, req, locked))
        if len(pool) % k:
            notes.append(f"{len(pool) % k} GPU(s) left unused: {len(pool)} GPUs do not split into groups of {k}")
        for unit in pool:
            reasons = busy_reasons(unit, req)
            if reasons:
                notes.append(f"GPU {unit.label} is busy ({'; '.join(reasons)}); --nproc gpu uses every allowed GPU")
    else:
        n = nproc if isinstance(nproc, int) else 1
    need = n * k
    if len(pool) < need:
        raise PlanError(_shortage(n, k, pool, candidates, excluded, visible, inventory, req, locked))
    position = {u.uuid: i for i, u in enumerate(visible.units)}
    ranked = sorted(
        pool,
        key=lambda u: (
            0 if (u.utilization or 0) == 0 and not u.processes and u.memory_used == 0 else 1,
            -u.memory_free,
            position[u.uuid],
        ),
    )
    chosen_units = sorted(ranked[:need], key=lambda u: position[u.uuid])
    groups = [tuple(chosen_units[i : i + k]) for i in range(0, need, k)]
    return _build(req, groups, "nccl", notes, inventory, visible, allowed)


def _shortage(
    n: int,
    k: int,
    pool: Sequence[GPU],
    candidates: Sequence[GPU],
    excluded: Sequence[GPU],
    visible: Visible,
    inventory: Inventory,
    req: Request,
    locked: Mapping[str, str],
) -> str:
    need = n * k
    ranks, gpus, free = plural(n, "rank"), plural(k, "GPU"), plural(need, "free GPU")
    parts = [
        f"{ranks} × {gpus} need {free}, "
        f"but only {len(pool)} {'is' if len(pool) == 1 else 'are'} free ({', '.join(u.label for u in pool) or 'none'})"
    ]
    parts.append(_gpu_range(inventory))
    busy = [
        f"{u.label} ({'; '.join(busy_reasons(u, req, locked))})" for u in candidates if busy_reasons(u, req, locked)
    ]
    if busy:
        parts.append("busy: " + ", ".join(busy))
    if excluded:
        parts.append("excluded: " + ", ".join(u.label for u in excluded))
    if visible.restricted:
        parts.append(visible.describe())
    return (
        "; ".join(parts)
        + ". Ask for fewer ranks, name GPUs with --gpus (busy ones included), or raise --max-used-memory / --max-util."
    )


def _build(
    req: Request,
    groups: Sequence[tuple[GPU, ...]],
    backend: str,
    notes: list[str],
    inventory: Inventory,
    visible: Visible,
    allowed: tuple[int, ...],
) -> Plan:
    nlocal = len(groups)
    everything = ",".join(u.uuid for g in groups for u in g)
    mode = req.cpu_affinity.strip().lower()
    if mode == "none":
        cores: list[tuple[int, ...]] = [() for _ in groups]
        share = max(1, len(allowed) // max(nlocal, 1))
        threads = [share] * nlocal
    else:
        if mode == "auto":
            cores = assign_cores([tuple(c for u in g for c in u.cpu_affinity) for g in groups], allowed)
        else:
            cores = explicit_cores(req.cpu_affinity, nlocal, allowed)
        # A rank's share; ranks that had to share cores (more ranks than cores) get one thread each.
        users: dict[int, int] = {}
        for cs in cores:
            for c in cs:
                users[c] = users.get(c, 0) + 1
        threads = [max(1, sum(1 for c in cs if users[c] == 1)) for cs in cores]
    slots = []
    for local, group in enumerate(groups):
        if not group:
            cvd, device = "", "cpu"
        elif req.isolation == "rank":
            cvd, device = ",".join(u.uuid for u in group), "cuda:0"
        else:
            cvd, device = everything, f"cuda:{local * len(group)}"
        slots.append(RankSlot(req.node_rank * nlocal + local, local, group, cvd, device, cores[local], threads[local]))
    return Plan(
        ranks=tuple(slots),
        world_size=nlocal * req.nnodes,
        nnodes=req.nnodes,
        node_rank=req.node_rank,
        isolation=req.isolation,
        backend=backend,
        notes=tuple(notes),
        inventory_source=inventory.source,
        visible=visible.describe(),
    )
