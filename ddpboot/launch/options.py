"""Parsing of the launcher's option values: pure functions, each error naming the option, the value and the fix.

torchrun's forms are accepted as they are (`-r 3`, `-t 0:1,1:2`, `--signals-to-handle SIGTERM,SIGINT`), without its
limits: a per-rank map may name any local rank (`0:1,10:2`), not single digits only.
"""

from __future__ import annotations

import re
import signal
from enum import IntFlag

from ddpboot.errors import UsageError


class Std(IntFlag):
    """Which of a worker's streams an option applies to (torchrun's values: 0 none, 1 out, 2 err, 3 both)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


StdSpec = Std | dict[int, Std]

_STD_HELP = "0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank as RANK:VALUE pairs (0:3,10:2)"


def parse_std(text: str, option: str) -> StdSpec:
    """`3` (every rank) or `0:1,10:2` (per local rank); syntax only (see resolve_std for the ranks)."""
    t = text.strip()
    if re.fullmatch(r"[0-3]", t):
        return Std(int(t))
    if t == "":
        raise UsageError(f"{option} is empty: give {_STD_HELP}.")
    out: dict[int, Std] = {}
    for part in t.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*:\s*([0-3])\s*", part)
        if not m:
            raise UsageError(f"{option} {text!r}: {part.strip()!r} is not RANK:VALUE; give {_STD_HELP}.")
        rank = int(m.group(1))
        if rank in out:
            raise UsageError(f"{option} {text!r} names local rank {rank} twice.")
        out[rank] = Std(int(m.group(2)))
    return out


def resolve_std(spec: StdSpec, nlocal: int, option: str) -> dict[int, Std]:
    """The streams for every local rank 0..nlocal-1; a map naming a rank this node does not run is an error."""
    if isinstance(spec, Std):
        return dict.fromkeys(range(nlocal), spec)
    extra = sorted(r for r in spec if r >= nlocal)
    if extra:
        raise UsageError(
            f"{option} names local rank{'s' if len(extra) > 1 else ''} {', '.join(map(str, extra))}, but this node "
            f"runs {nlocal} rank{'s' if nlocal != 1 else ''} (local ranks 0-{nlocal - 1})."
        )
    return {r: spec.get(r, Std.NONE) for r in range(nlocal)}


def parse_rank_list(text: str, option: str) -> frozenset[int]:
    """`0,2,5-7` → {0, 2, 5, 6, 7}."""
    out: set[int] = set()
    if text.strip() == "":
        raise UsageError(f"{option} is empty: give ranks as a comma list with ranges, e.g. {option} 0,2-3.")
    for part in text.split(","):
        p = part.strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", p)
        if not m:
            raise UsageError(f"{option} {text!r}: {p!r} is not a rank or a range (e.g. 0,2-3).")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"{option} {text!r}: the range {p!r} runs backwards; write {hi}-{lo}.")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def check_rank_filter(ranks: frozenset[int], limit: int, option: str, what: str) -> None:
    """A rank filter (--ranks-filter, --local-ranks-filter) names only ranks below `limit`, the ones the job has."""
    beyond = sorted(r for r in ranks if r >= limit)
    if beyond:
        raise UsageError(
            f"{option} names {what} {', '.join(map(str, beyond[:5]))}{'…' if len(beyond) > 5 else ''}, but the job "
            f"has {limit} ({what}s 0-{limit - 1})."
        )


# Signals a launcher cannot or must not take over: SIGKILL/SIGSTOP cannot be caught, SIGCHLD drives supervision.
_UNFORWARDABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
# SIGUSR2 is not among them: it is the launcher's own stack-dump signal (ddpboot/contract.py STACKS_SIGNAL); listing
# it in --signals-to-handle forwards it to the workers instead.
DEFAULT_SIGNALS = "SIGINT,SIGTERM,SIGHUP,SIGQUIT,SIGUSR1"


def parse_signals(text: str, option: str = "--signals-to-handle") -> tuple[signal.Signals, ...]:
    """`SIGTERM,SIGINT` (torchrun's form), also `term,int` or numbers; order kept, duplicates dropped."""
    out: list[signal.Signals] = []
    if text.strip() == "":
        raise UsageError(f"{option} is empty: give signal names, e.g. {option} {DEFAULT_SIGNALS}.")
    for part in text.split(","):
        p = part.strip().upper()
        sig: signal.Signals | None = None
        if p.isdigit():
            try:
                sig = signal.Signals(int(p))
            except ValueError:
                sig = None
        else:
            name = p if p.startswith("SIG") else "SIG" + p
            sig = getattr(signal.Signals, name, None)
        if sig is None:
            raise UsageError(f"{option} {text!r}: {part.strip()!r} is not a signal; give names like {DEFAULT_SIGNALS}.")
        if sig in _UNFORWARDABLE:
            raise UsageError(
                f"{option} {text!r}: {sig.name} cannot be handled by a launcher (SIGKILL and SIGSTOP cannot be caught; "
                "SIGCHLD is how it learns that workers exit)."
            )
        if sig not in out:
            out.append(sig)
    return tuple(out)


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """`key1=value1,key2=value2` (torchrun's --rdzv-conf)."""
    out: dict[str, str] = {}
    for part in text.split(","):
        p = part.strip()
        if not p:
            continue
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--rdzv-conf {text!r}: {p!r} is not KEY=VALUE (e.g. --rdzv-conf timeout=900).")
        out[key.strip()] = value.strip()
    return out


def parse_duration(value: float, option: str, allow_zero: bool = True) -> float:
    """Seconds given to an option: not negative (nor NaN), and above zero unless `allow_zero`."""
    if value != value or value < 0 or (value == 0 and not allow_zero):
        need = "zero or more" if allow_zero else "more than zero"
        raise UsageError(f"{option} {value}: give {need} seconds.")
    return float(value)
