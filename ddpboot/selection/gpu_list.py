"""The GPU lists of --gpus and --exclude: `0,2-3`, `GPU-5f1c`, `0000:18:00.0`, `1:0`.

`parse_gpu_list` checks the syntax only (at the command line's boundary, through selection/request.py);
`resolve_list` names the inventory's GPUs (in the planner). Indices are physical (NVML / nvidia-smi) indices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddpboot.errors import PlanError, UsageError
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.visible import match_unit

_INT = re.compile(r"^\d+$")
_RANGE = re.compile(r"^(\d+)-(\d+)$")
_MIG = re.compile(r"^(\d+):(\d+)$")
_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")

BusAddress = tuple[int, int, int, int]  # PCI domain, bus, device, function


@dataclass(frozen=True)
class Token:
    """One entry of a GPU list: `text` as the user wrote it (the messages quote it), and what it names."""

    text: str


@dataclass(frozen=True)
class GpuIndex(Token):
    """`3`: a GPU by its physical index (a MIG-enabled GPU means all its instances)."""

    index: int


@dataclass(frozen=True)
class MigInstance(Token):
    """`3:1`: MIG instance 1 of GPU 3."""

    index: int
    mig_index: int


@dataclass(frozen=True)
class BusId(Token):
    """`0000:18:00.0` (the domain may be left out): a GPU by its PCI bus id."""

    address: BusAddress


@dataclass(frozen=True)
class UuidPrefix(Token):
    """`GPU-5f1c...` or `MIG-...`: a unit by its UUID or a unique prefix of it."""


GpuToken = GpuIndex | MigInstance | BusId | UuidPrefix


@dataclass(frozen=True)
class GpuList:
    """A parsed GPU list: the tokens in the order given (ranges expanded), and the text as the user wrote it."""

    text: str
    tokens: tuple[GpuToken, ...]


def bus_address(text: str) -> BusAddress | None:
    """`0000:18:00.0` or `18:00.0` → (0, 0x18, 0, 0); None when `text` is not a PCI bus id."""
    m = _BUS.match(text)
    if not m:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))


def _token(text: str) -> GpuToken | None:
    if _INT.match(text):
        return GpuIndex(text, int(text))
    m = _MIG.match(text)
    if m:
        return MigInstance(text, int(m.group(1)), int(m.group(2)))
    address = bus_address(text)
    if address is not None:
        return BusId(text, address)
    return UuidPrefix(text) if _UUID.match(text) else None


def parse_gpu_list(text: str, option: str) -> GpuList:
    """Split a GPU list into tokens, expanding ranges; syntax only (which GPUs exist is `resolve_list`'s business)."""
    if text.strip() == "":
        raise UsageError(
            f"{option} is empty. Give GPUs as indices (0,2), ranges (0-3), UUIDs (GPU-5f1c...) or PCI bus ids."
        )
    tokens: list[GpuToken] = []
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
            tokens.extend(GpuIndex(str(x), x) for x in range(lo, hi + 1))
            continue
        token = _token(tok)
        if token is None:
            raise UsageError(
                f"{where}: {tok!r} is not a GPU. Use an index (3), a range (0-3), a MIG instance (3:1), a UUID or "
                "its prefix (GPU-5f1c, MIG-...), or a PCI bus id (0000:18:00.0)."
            )
        tokens.append(token)
    return GpuList(text, tuple(tokens))


# --- resolving against an inventory ----------------------------------------------------------------


def _by_index(token: GpuIndex, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    for gpu in inventory.gpus:
        if gpu.index == token.index:
            return gpu.units()
    if not inventory.gpus:  # a first try on a laptop or CI runner: say how to run here
        raise PlanError(
            f"{option}: GPU {token.text} does not exist; {inventory.describe()}. Leave {option} out to run here: "
            "without GPUs the ranks run on CPU with gloo (--cpu asks for that anywhere)."
        )
    raise PlanError(
        f"{option}: GPU {token.text} does not exist; {inventory.describe()}. Run `ddpboot gpus` to see them."
    )


def _by_mig(token: MigInstance, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    units = inventory.units()
    for unit in units:
        if unit.index == token.index and unit.mig_index == token.mig_index:
            return (unit,)
    migs = ", ".join(u.label for u in units if u.mig_index is not None) or "none"
    raise PlanError(f"{option}: MIG instance {token.text} does not exist; MIG instances here: {migs}.")


def _by_bus(token: BusId, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    for gpu in inventory.gpus:
        if bus_address(gpu.pci_bus_id) == token.address:
            return gpu.units()
    known = ", ".join(f"{g.index}={g.pci_bus_id}" for g in inventory.gpus) or "none"
    raise PlanError(f"{option}: no GPU has PCI bus id {token.text}; bus ids here: {known}.")


def _by_uuid(token: UuidPrefix, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    unit = match_unit(token.text, inventory, option)
    if unit is None:
        raise PlanError(
            f"{option}: no GPU has a UUID starting with {token.text!r}; {inventory.describe()}. "
            "`ddpboot gpus` lists their UUIDs."
        )
    return unit.units()


def resolve_token(token: GpuToken, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    """The unit(s) a token names; a MIG-enabled GPU named by index, bus id or UUID means all its instances."""
    if isinstance(token, GpuIndex):
        return _by_index(token, inventory, option)
    if isinstance(token, MigInstance):
        return _by_mig(token, inventory, option)
    if isinstance(token, BusId):
        return _by_bus(token, inventory, option)
    return _by_uuid(token, inventory, option)


def resolve_list(gpus: GpuList, inventory: Inventory, option: str) -> tuple[GPU, ...]:
    """The units a list names, in its order; a unit named twice (even in two spellings) is an error."""
    out: list[GPU] = []
    for token in gpus.tokens:
        for unit in resolve_token(token, inventory, option):
            if any(u.uuid == unit.uuid for u in out):
                raise UsageError(f"{option} {gpus.text!r} names GPU {unit.label} more than once. List each GPU once.")
            out.append(unit)
    return tuple(out)
