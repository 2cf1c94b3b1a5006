"""Request + Inventory + Visible → Plan: which GPUs each local rank gets. A pure function; nothing is started here.

Indices on the command line are physical (NVML / nvidia-smi) indices, whatever CUDA_VISIBLE_DEVICES says; inside
an inherited CUDA_VISIBLE_DEVICES they must still name a GPU that it allows. The options were parsed and checked
against each other already (selection/request.py); here they are resolved against the machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddpboot.contract import Isolation
from ddpboot.errors import PlanError, UsageError
from ddpboot.selection.affinity import memory_nodes, rank_cores
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.gpu_list import GpuList, resolve_list
from ddpboot.selection.request import Request
from ddpboot.selection.visible import Visible, resolve_visible
from ddpboot.units import format_size, plural

Groups = list[tuple[GPU, ...]]  # one entry per local rank: its GPUs (empty for a CPU rank)


class GpusBusy(PlanError):
    """The plan needs GPUs that are busy or locked now but that the machine allows: waiting (--wait-for-gpus) may
    help. Any other PlanError is a request this machine can never meet, however long one waits."""


def _json_of(record: object, names: str) -> dict[str, Any]:
    """The attributes `names` of `record` as JSON, in that order: a tuple as a list, a record as its to_json()."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value.to_json() if hasattr(value, "to_json") else value

    return {name: plain(getattr(record, name)) for name in names.split()}


@dataclass(frozen=True)
class RankSlot:
    rank: int
    local_rank: int
    gpus: tuple[GPU, ...]
    cuda_visible_devices: str
    device: str  # what the worker should use: "cuda:0", "cuda:3" (node isolation) or "cpu"
    cpus: tuple[int, ...] = ()  # the cores the worker is bound to; empty: not bound
    omp_threads: int = 1  # OMP_NUM_THREADS when the user has not set it: the rank's share of the cores
    mem_nodes: tuple[int, ...] = ()  # NUMA nodes its memory is preferred from (--numa-binding); empty: the default

    def to_json(self) -> dict[str, Any]:
        return _json_of(self, "rank local_rank cuda_visible_devices device cpus omp_threads mem_nodes gpus")


@dataclass(frozen=True)
class Plan:
    ranks: tuple[RankSlot, ...]
    world_size: int
    nnodes: int
    node_rank: int
    isolation: Isolation
    backend: str
    notes: tuple[str, ...] = ()
    inventory_source: str = "none"
    visible: str = "all GPUs"
    cluster: dict[str, Any] = field(default_factory=dict)

    @property
    def local_world_size(self) -> int:
        return len(self.ranks)

    def gpus_hidden_by_isolation(self) -> tuple[int, int] | None:
        """(GPUs each rank sees, GPUs this node selected) when rank isolation shows each rank fewer GPUs than the
        node selected, so that `torch.cuda.device_count()` differs from torchrun's; None otherwise."""
        if not self.isolation.own_gpus_only or not self.ranks:
            return None
        per_rank = len(self.ranks[0].gpus)
        selected = sum(len(slot.gpus) for slot in self.ranks)
        return (per_rank, selected) if 0 < per_rank < selected else None

    def to_json(self) -> dict[str, Any]:
        return {**_json_of(self, "world_size nnodes node_rank local_world_size isolation backend"),
                "inventory": self.inventory_source, **_json_of(self, "visible ranks notes")}


FAILING_NOTE = "is marked failing"  # how the note of a failing GPU named with --gpus goes on after its label


def busy_reasons(gpu: GPU, req: Request, locked: Mapping[str, str] | None = None,
                 failing: Mapping[str, str] | None = None) -> list[str]:
    """Why automatic selection would not pick this GPU (empty: it is free). `locked`: uuid → holder; `failing`:
    uuid → why the health ledger (selection/ledger.py) marked it."""
    reasons = []
    if failing and gpu.uuid in failing:
        reasons.append(f"failing: {failing[gpu.uuid]}")
    if locked and gpu.uuid in locked:
        reasons.append(f"locked by {locked[gpu.uuid]}")
    if gpu.memory_used > req.max_used_memory:
        reasons.append(f"{format_size(gpu.memory_used)} used > {format_size(req.max_used_memory)}")
    if gpu.utilization is not None and gpu.utilization > req.max_util:
        reasons.append(f"{gpu.utilization}% busy > {req.max_util}%")
    if gpu.processes:
        reasons.append(f"{len(gpu.processes)} process{'es' if len(gpu.processes) > 1 else ''} running")
    return reasons


def make_plan(
    req: Request,
    inventory: Inventory,
    env: Mapping[str, str],
    cpu_count: int | None = None,
    allowed_cpus: Sequence[int] | None = None,
    locked: Mapping[str, str] | None = None,
    failing: Mapping[str, str] | None = None,
) -> Plan:
    """The rank → GPU map for this node. Pure: every input is an argument.

    `allowed_cpus` are the cores the launcher may use (its own affinity); `cpu_count` defaults to their number.
    `locked` maps the UUIDs of GPUs that other ddpboot jobs hold to a description of the holder; `failing` those
    the health ledger marked to why: never chosen automatically, named with --gpus they run with a note.
    """
    allowed = tuple(allowed_cpus) if allowed_cpus is not None else tuple(range(cpu_count or 1))
    visible = resolve_visible(inventory, env)
    choosing = _Choosing(
        req,
        inventory,
        visible,
        excluded=resolve_list(req.exclude, inventory, "--exclude") if req.exclude else (),
        locked=locked or {},
        failing=failing or {},
        cpu_count=len(allowed) if cpu_count is None else cpu_count,
        notes=[*inventory.notes, *visible.notes],
    )
    groups, backend = choosing.choose()
    return _layout(req, groups, backend, choosing.notes, inventory, visible, allowed)


@dataclass
class _Choosing:
    """One planning: the resolved inputs, and the notes gathered on the way."""

    req: Request
    inventory: Inventory
    visible: Visible
    excluded: tuple[GPU, ...]
    locked: Mapping[str, str]
    failing: Mapping[str, str]
    cpu_count: int
    notes: list[str]

    def choose(self) -> tuple[Groups, str]:
        """The ranks' GPU groups and the backend."""
        nproc = self.req.nproc
        if self.req.cpu:
            n = nproc if isinstance(nproc, int) else (self.cpu_count if nproc in ("cpu", "auto") else 1)
            return self.cpu_ranks(n, "--cpu asked for CPU ranks")
        if nproc == "cpu":
            return self.cpu_ranks(self.cpu_count, "--nproc cpu asked for one CPU rank per core")
        if self.req.gpus:
            return self.named(self.req.gpus), "nccl"
        return self.automatic()

    def cpu_ranks(self, n: int, why: str) -> tuple[Groups, str]:
        k = self.req.gpus_per_proc
        if k != 1:
            raise UsageError(f"--gpus-per-proc {k} needs GPUs, but {why}.")
        self.notes.append(f"{plural(n, 'CPU rank')} (gloo): {why}")
        return [() for _ in range(n)], "gloo"

    def cpu_instead(self, why: str) -> tuple[Groups, str]:
        """CPU ranks where no GPU can be had and none was asked for: `auto` means one per core."""
        nproc = self.req.nproc
        n = self.cpu_count if nproc == "auto" else (nproc if isinstance(nproc, int) else 1)
        return self.cpu_ranks(n, why)

    # --- GPUs named with --gpus ----------------------------------------------------------------------

    def named(self, gpus: GpuList) -> Groups:
        k, nproc = self.req.gpus_per_proc, self.req.nproc
        chosen = resolve_list(gpus, self.inventory, "--gpus")
        for unit in chosen:
            self.check_allowed(unit, gpus)
        if len(chosen) % k:
            raise UsageError(f"--gpus {gpus.text} names {len(chosen)} GPUs, which --gpus-per-proc {k} does not divide.")
        if isinstance(nproc, int) and nproc * k != len(chosen):
            raise UsageError(
                f"--nproc {nproc} × --gpus-per-proc {k} needs {nproc * k} GPUs but --gpus {gpus.text} names "
                f"{len(chosen)}. Drop --nproc (it defaults to the number of GPUs listed) or list {nproc * k}."
            )
        for unit in chosen:
            self.check_free(unit, gpus)
        return [tuple(chosen[i : i + k]) for i in range(0, len(chosen), k)]

    def check_allowed(self, unit: GPU, gpus: GpuList) -> None:
        if any(u.uuid == unit.uuid for u in self.excluded):
            exclude = self.req.exclude.text if self.req.exclude else ""
            raise UsageError(
                f"GPU {unit.label} is both listed in --gpus {gpus.text} and excluded by --exclude {exclude}. "
                "Remove it from one of the two."
            )
        if not self.visible.allows(unit):
            raise PlanError(
                f"--gpus {gpus.text}: GPU {unit.label} is not visible to this process ({self.visible.describe()}). "
                "Indices on the command line are physical (nvidia-smi) indices and must name a GPU that the "
                "inherited CUDA_VISIBLE_DEVICES allows; pick among those, or unset CUDA_VISIBLE_DEVICES."
            )

    def check_free(self, unit: GPU, gpus: GpuList) -> None:
        """A named GPU is used even when busy (with a note), but not while another job holds it, unless shared."""
        if unit.uuid in self.locked and not self.req.share:
            raise GpusBusy(
                f"--gpus {gpus.text}: GPU {unit.label} is locked by another ddpboot job: {self.locked[unit.uuid]}. "
                "Choose other GPUs, wait for it (--wait-for-gpus), or use it anyway with --share."
            )
        if unit.uuid in self.failing:
            self.notes.append(f"GPU {unit.label} {FAILING_NOTE} ({self.failing[unit.uuid]}) but was asked for with "
                              f"--gpus: running on it anyway (`ddpboot gpus --clear {unit.label}` clears the mark)")
        reasons = busy_reasons(unit, self.req, self.locked)
        if reasons:
            self.notes.append(f"GPU {unit.label} is busy ({'; '.join(reasons)}) but was asked for explicitly")

    # --- automatic choice ----------------------------------------------------------------------------

    def automatic(self) -> tuple[Groups, str]:
        nproc, k = self.req.nproc, self.req.gpus_per_proc
        wants_gpu = nproc == "gpu" or k > 1
        excluded = {u.uuid for u in self.excluded}
        candidates = [u for u in self.visible.units if u.uuid not in excluded]
        if not self.inventory.gpus:
            if wants_gpu:
                raise PlanError(
                    f"{'--nproc gpu' if nproc == 'gpu' else f'--gpus-per-proc {k}'} asks for GPUs, but this machine "
                    f"has none ({'; '.join(self.inventory.notes) or 'the inventory is empty'}). "
                    "Use --nproc N for CPU ranks."
                )
            return self.cpu_instead("this machine has no GPUs")
        if not candidates:
            return self.nothing_to_choose(wants_gpu)
        # `gpu` means every allowed GPU, busy or not (e.g. those a SLURM job was given); otherwise only free ones.
        if nproc == "gpu":
            pool = [u for u in candidates if u.uuid not in self.locked and u.uuid not in self.failing]
        else:
            pool = [u for u in candidates if not busy_reasons(u, self.req, self.locked, self.failing)]
        n = self.rank_count(pool, candidates)
        if len(pool) < n * k:
            raise self.shortage_error(n, pool, candidates)
        chosen = self.preferred(pool, n * k)
        return [tuple(chosen[i : i + k]) for i in range(0, n * k, k)], "nccl"

    def nothing_to_choose(self, wants_gpu: bool) -> tuple[Groups, str]:
        """Every GPU is hidden by CUDA_VISIBLE_DEVICES (CPU ranks, unless GPUs were asked for) or excluded."""
        visible = self.visible
        if visible.restricted and not visible.units:
            if wants_gpu:
                raise PlanError(
                    f"{visible.describe()}: it hides every GPU, yet GPUs were asked for. Unset CUDA_VISIBLE_DEVICES "
                    "or set it to the GPUs this job may use."
                )
            if (visible.raw or "").strip() not in ("", "-1"):  # only '' and -1 hide every GPU on purpose
                raise PlanError(
                    f"CUDA_VISIBLE_DEVICES={visible.raw!r} names no GPU of this machine "
                    f"({self.inventory.describe()}), so CUDA would hide every GPU and the job would run on CPU. "
                    "Set it to GPUs that exist (indices or UUIDs from `ddpboot gpus`), to '' or -1 for CPU ranks "
                    "on purpose, or unset it."
                )
            return self.cpu_instead(f"CUDA_VISIBLE_DEVICES={visible.raw!r} hides every GPU")
        exclude = self.req.exclude.text if self.req.exclude else ""
        raise PlanError(
            f"--exclude {exclude} leaves no GPU to run on: {self.inventory.describe()}"
            + (f" and {visible.describe()}" if visible.restricted else "")
            + ". Exclude fewer GPUs."
        )

    def rank_count(self, pool: Sequence[GPU], candidates: Sequence[GPU]) -> int:
        """How many ranks: as asked, or for `gpu`/`auto` as many as the pool has GPU groups for."""
        nproc, k = self.req.nproc, self.req.gpus_per_proc
        if nproc not in ("gpu", "auto"):
            return nproc if isinstance(nproc, int) else 1
        n = len(pool) // k
        if n == 0:
            raise self.shortage_error(1, pool, candidates)
        if len(pool) % k:
            self.notes.append(f"{len(pool) % k} GPU(s) left unused: {len(pool)} GPUs do not split into groups of {k}")
        for unit in pool:
            reasons = busy_reasons(unit, self.req)
            if reasons:
                self.notes.append(
                    f"GPU {unit.label} is busy ({'; '.join(reasons)}); --nproc gpu uses every allowed GPU"
                )
        return n

    def preferred(self, pool: Sequence[GPU], need: int) -> list[GPU]:
        """The `need` best of the pool (idle first, then the most free memory), in CUDA's order."""
        position = {u.uuid: i for i, u in enumerate(self.visible.units)}
        ranked = sorted(
            pool,
            key=lambda u: (
                0 if (u.utilization or 0) == 0 and not u.processes and u.memory_used == 0 else 1,
                -u.memory_free,
                position[u.uuid],
            ),
        )
        return sorted(ranked[:need], key=lambda u: position[u.uuid])

    def shortage_error(self, n: int, pool: Sequence[GPU], candidates: Sequence[GPU]) -> PlanError:
        """GpusBusy when the allowed GPUs would do once the busy or locked ones are free; else a plain PlanError."""
        healthy = [u for u in candidates if u.uuid not in self.failing]  # a failing GPU is not worth waiting for
        cls = GpusBusy if len(healthy) >= n * self.req.gpus_per_proc else PlanError
        return cls(self.shortage(n, pool, candidates))

    def shortage(self, n: int, pool: Sequence[GPU], candidates: Sequence[GPU]) -> str:
        """Why `n` ranks cannot be had: what is free, and why each other GPU is not."""
        k = self.req.gpus_per_proc
        ranks, gpus, free = plural(n, "rank"), plural(k, "GPU"), plural(n * k, "free GPU")
        parts = [
            f"{ranks} × {gpus} need {free}, but only {len(pool)} {'is' if len(pool) == 1 else 'are'} free "
            f"({', '.join(u.label for u in pool) or 'none'})",
            self.inventory.describe(),
        ]
        busy = [(u, busy_reasons(u, self.req, self.locked, self.failing)) for u in candidates]
        if any(reasons for _, reasons in busy):
            parts.append("busy: " + ", ".join(f"{u.label} ({'; '.join(r)})" for u, r in busy if r))
        if self.excluded:
            parts.append("excluded: " + ", ".join(u.label for u in self.excluded))
        if self.visible.restricted:
            parts.append(self.visible.describe())
        if len(candidates) < n * k:  # more than the machine allows: no threshold or waiting changes that
            todo = "Ask for at most " + plural(len(candidates) // k, "rank") + ", or run CPU ranks with --cpu."
        elif any(reasons for _, reasons in busy):
            todo = ("Ask for fewer ranks, name GPUs with --gpus (busy ones included), or raise --max-used-memory / "
                    "--max-util.")
        else:
            todo = "Ask for fewer ranks, or wait until the locked GPUs are free (--wait-for-gpus)."
        return "; ".join(parts) + ". " + todo


def _layout(
    req: Request,
    groups: Groups,
    backend: str,
    notes: list[str],
    inventory: Inventory,
    visible: Visible,
    allowed: tuple[int, ...],
) -> Plan:
    """The plan for these groups: each rank's CUDA_VISIBLE_DEVICES, device, cores and threads."""
    nlocal = len(groups)
    everything = [u.uuid for g in groups for u in g]
    near = [tuple(c for u in g for c in u.cpu_affinity) for g in groups]
    cores, threads = rank_cores(req.cpu_affinity, near, allowed)
    mems = memory_nodes(req.cpu_affinity, cores)
    slots = []
    for local, group in enumerate(groups):
        if not group:
            cvd, device = "", "cpu"
        else:
            cvd = req.isolation.visible_devices([u.uuid for u in group], everything)
            device = f"cuda:{req.isolation.first_device(local, len(group))}"
        slots.append(RankSlot(req.node_rank * nlocal + local, local, group, cvd, device, cores[local], threads[local],
                              mems[local]))
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
