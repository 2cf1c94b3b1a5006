"""Which GPUs this process may use: CUDA_VISIBLE_DEVICES read exactly as CUDA reads it, plus SLURM's GPU ids.

CUDA's rules: entries are integer indices, `GPU-<uuid>` (any unique prefix) or `MIG-<uuid>`; the
list is cut at the first invalid entry (`1,foo,0` is one device); `''` and `-1` hide every GPU; a duplicate is an
error (CUDA fails with error 101). Integer indices follow CUDA_DEVICE_ORDER: PCI_BUS_ID makes them nvidia-smi
indices; the default FASTEST_FIRST agrees with PCI order only when all GPUs are the same model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddpboot.errors import VisibilityError

if TYPE_CHECKING:  # the worker imports this module inside every rank: only what it needs at run time
    from ddpboot.selection.gpu import GPU, Inventory

_INT = re.compile(r"^\d+$")


@dataclass(frozen=True)
class Visible:
    """The units (whole GPUs or MIG instances) this process may use, in CUDA's ordinal order."""

    units: tuple[GPU, ...]
    restricted: bool  # CUDA_VISIBLE_DEVICES was set
    raw: str | None
    notes: tuple[str, ...] = ()

    def allows(self, unit: GPU) -> bool:
        return any(u.uuid == unit.uuid for u in self.units)

    def describe(self) -> str:
        if not self.restricted:
            return "all GPUs"
        shown = ", ".join(u.label for u in self.units) or "none"
        return f"CUDA_VISIBLE_DEVICES={self.raw!r} allows {shown}"


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """Split CUDA_VISIBLE_DEVICES into its entries as CUDA does; None when unset (every GPU visible).

    Only the syntax is checked here: the list is cut at the first entry that is neither a non-negative integer nor a
    `GPU-`/`MIG-` UUID. Whether an index or UUID names an existing GPU is decided against an inventory
    (`resolve_visible`), where CUDA also cuts the list.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if _INT.match(entry) or (entry[:4] in ("GPU-", "MIG-") and len(entry) > 4):
            out.append(entry)
        else:
            break
    return tuple(out)


def cuda_enumeration(inventory: Inventory, env: Mapping[str, str]) -> tuple[tuple[GPU, ...], tuple[str, ...]]:
    """The whole GPUs in the order CUDA numbers them before CUDA_VISIBLE_DEVICES applies, and notes on assumptions."""
    gpus = inventory.gpus
    order = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
    if order != "PCI_BUS_ID" and len({g.name for g in gpus}) > 1:
        models = ", ".join(sorted({g.name for g in gpus}))
        return gpus, (
            "CUDA_DEVICE_ORDER is not PCI_BUS_ID and this machine mixes GPU models "
            f"({models}): CUDA's FASTEST_FIRST numbering may differ from nvidia-smi's, so integer indices in "
            "CUDA_VISIBLE_DEVICES were read in PCI order (an assumption). Use UUIDs there, or set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID, to make them unambiguous.",
        )
    return gpus, ()


def _slurm_gpu_ids(env: Mapping[str, str]) -> tuple[int, ...] | None:
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        text = env.get(var, "").strip()
        if text:
            parts = [p.strip() for p in text.split(",")]
            if all(_INT.match(p) for p in parts):
                return tuple(int(p) for p in parts)
    return None


def match_uuid(prefix: str, units: Sequence[GPU], what: str) -> GPU | None:
    """The unit whose UUID starts with `prefix` (case-insensitive); None when none does; an error when several do."""
    p = prefix.lower()
    hits = [u for u in units if u.uuid.lower().startswith(p)]
    if len(hits) > 1:
        names = ", ".join(f"{u.label} ({u.uuid})" for u in hits)
        raise VisibilityError(
            f"{what}: the UUID prefix {prefix!r} is ambiguous: it matches GPUs {names}. Give more of the UUID."
        )
    return hits[0] if hits else None


def match_unit(prefix: str, inventory: Inventory, what: str) -> GPU | None:
    """The GPU or MIG instance a UUID (or prefix) names. A `GPU-` prefix names a whole GPU first, so that the UUID
    of a MIG-enabled GPU stands for all its instances (through `GPU.units()`)."""
    whole = match_uuid(prefix, inventory.gpus, what) if prefix.startswith("GPU-") else None
    return whole or match_uuid(prefix, inventory.units(), what)


def resolve_visible(inventory: Inventory, env: Mapping[str, str]) -> Visible:
    """Resolve CUDA_VISIBLE_DEVICES (and SLURM's renumbering) against the inventory."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible_devices(raw)
    if entries is None:
        return Visible(inventory.units(), False, None)
    notes: list[str] = []
    if raw is not None and len(entries) < len([e for e in raw.split(",")]) and raw.strip() not in ("", "-1"):
        bad = raw.split(",")[len(entries)].strip()
        notes.append(
            f"CUDA_VISIBLE_DEVICES={raw!r}: CUDA stops reading at the invalid entry {bad!r}, so only "
            f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} count"
        )
    enumeration, order_notes = cuda_enumeration(inventory, env)
    notes.extend(order_notes)
    slurm_ids = _slurm_gpu_ids(env)
    ints = [int(e) for e in entries if _INT.match(e)]
    if (
        slurm_ids is not None
        and len(ints) == len(entries) > 0
        and set(ints) == set(range(len(slurm_ids)))
        and set(ints) != set(slurm_ids)
    ):
        # Devices constrained by a cgroup: SLURM gives local indices 0..n-1 for its global GPU ids.
        by_index = {g.index: g for g in inventory.gpus}
        enumeration = tuple(by_index[g] for g in sorted(slurm_ids) if g in by_index)
        notes.append(
            f"CUDA_VISIBLE_DEVICES={raw!r} holds SLURM's local indices; they name GPUs "
            f"{', '.join(str(g) for g in sorted(slurm_ids))} (SLURM_STEP_GPUS/SLURM_JOB_GPUS)"
        )

    picked: list[GPU] = []
    for entry in entries:
        units: tuple[GPU, ...]
        if _INT.match(entry):
            i = int(entry)
            if i >= len(enumeration):
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={raw!r}: index {i} does not exist ({len(enumeration)} GPUs), so CUDA "
                    "ignores it and every entry after it"
                )
                break
            units = enumeration[i].units()
        else:
            unit = match_unit(entry, inventory, "CUDA_VISIBLE_DEVICES")
            if unit is None:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={raw!r}: no GPU has UUID {entry!r}, "
                    "so CUDA ignores it and every entry after it"
                )
                break
            units = unit.units()
        for u in units:
            if any(p.uuid == u.uuid for p in picked):
                raise VisibilityError(
                    f"CUDA_VISIBLE_DEVICES={raw!r} names GPU {u.label} ({u.uuid}) twice; CUDA refuses such a list "
                    "(error 101, invalid device ordinal). List each GPU once, or unset CUDA_VISIBLE_DEVICES."
                )
            picked.append(u)
    return Visible(tuple(picked), True, raw, tuple(notes))
