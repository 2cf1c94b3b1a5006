"""The `ddp` marker's arguments, checked, and which world sizes this machine can run. Pure: the counts of GPUs
and cores come in as arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpboot.launch.preflight import RANKS_PER_CORE  # the launcher's limit for CPU ranks without --oversubscribe

DEVICES = ("cpu", "gpu", "auto")
MARKER_HELP = ("ddp(nproc=2|[1, 2, 4], device='cpu'|'gpu'|'auto', timeout=120, args=[]): run the test on N ranks "
               "(a list: one test per size)")


class MarkerError(ValueError):
    """A `ddp` marker argument that cannot be used; the message says which and what to write."""


@dataclass(frozen=True)
class DdpOptions:
    sizes: tuple[int, ...]  # one test item per size
    device: str = "cpu"
    timeout: float = 120.0
    args: tuple[str, ...] = ()

    @property
    def matrix(self) -> bool:
        return len(self.sizes) > 1


def parse_marker(args: Sequence[Any], kwargs: Mapping[str, Any]) -> DdpOptions:
    """`@pytest.mark.ddp(...)`'s arguments as DdpOptions; raises MarkerError naming the bad one."""
    unknown = sorted(set(kwargs) - {"nproc", "device", "timeout", "args"})
    if unknown:
        raise MarkerError(f"@pytest.mark.ddp got {', '.join(unknown)}: it takes nproc, device, timeout and args")
    nproc = args[0] if args else kwargs.get("nproc", 2)
    values = list(nproc) if isinstance(nproc, (list, tuple)) else [nproc]
    if not values or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in values):
        raise MarkerError(f"@pytest.mark.ddp(nproc={nproc!r}): give a rank count ≥ 1 or a list of them, "
                          "e.g. nproc=2 or nproc=[1, 2, 4]")
    device = kwargs.get("device", "cpu")
    if device not in DEVICES:
        raise MarkerError(f"@pytest.mark.ddp(device={device!r}): choose cpu, gpu or auto")
    timeout = kwargs.get("timeout", 120.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise MarkerError(f"@pytest.mark.ddp(timeout={timeout!r}): give seconds > 0, e.g. timeout=60")
    extra = kwargs.get("args", ())
    if isinstance(extra, str) or not all(isinstance(a, str) for a in extra):
        raise MarkerError(f"@pytest.mark.ddp(args={extra!r}): give a list of launcher options, "
                          "e.g. args=['--isolation', 'node']")
    return DdpOptions(tuple(dict.fromkeys(values)), device, float(timeout), tuple(extra))


def uses_gpus(device: str, nproc: int, gpus: int) -> bool:
    return device == "gpu" or (device == "auto" and gpus >= nproc)


def skip_reason(device: str, nproc: int, gpus: int, cores: int) -> str | None:
    """Why this machine cannot run `nproc` ranks on `device`, or None when it can."""
    if device == "gpu" and gpus < nproc:
        return f"needs {nproc} GPUs for {nproc} ranks; this machine has {gpus}"
    if not uses_gpus(device, nproc, gpus) and nproc > RANKS_PER_CORE * cores:
        return (f"needs {nproc} CPU ranks, more than {RANKS_PER_CORE} per core on this machine's {cores} "
                f"core{'s' if cores != 1 else ''}")
    return None
