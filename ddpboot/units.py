"""Quantities as people write and read them: byte sizes ("24GiB", "500MB", "1073741824") and counted nouns; and
the words of the launcher's options (`OptionChoice`)."""

from __future__ import annotations

import re

from ddpboot.contract import Choice
from ddpboot.errors import UsageError


class OptionChoice(Choice):
    """A Choice of one of the launcher's options (`--log-mode`, `--store`, ...): a word it does not know is a
    UsageError (exit 2, nothing started)."""

    @classmethod
    def error(cls, message: str) -> Exception:
        return UsageError(message)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, what: str = "size") -> int:
    """Parse a byte count: a plain integer, or a number with a unit (KB, MiB, GB, GiB, ...)."""
    m = _SIZE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(
            f"{what} {text!r} is not a size. Give bytes or a number with a unit, e.g. 512MiB, 2GiB, 1.5GB."
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int | None) -> str:
    """1536 MiB -> '1.5 GiB'; binary units, as nvidia-smi shows memory."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit in ("B", "KiB") else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(n: int, word: str) -> str:
    """`1 node`, `2 nodes`: a count with its noun."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def short_uuid(uuid: str, keep: int = 12) -> str:
    """A GPU UUID as tables and messages show it: `GPU-8754c7d0…` (the whole UUID is in --json and the logs)."""
    return uuid[:keep] + "…" if len(uuid) > keep else uuid


_DURATION_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")


def parse_duration(value: str | float, option: str, *, allow_zero: bool = True, allow_inf: bool = False) -> float:
    """Seconds as people write them: `30`, `2.5`, `90s`, `10m`, `2h`, `1d`, and `inf` where `allow_inf` (wait
    forever). Never negative (nor NaN); above zero unless `allow_zero`. The error names the option and the forms."""
    text = str(value).strip().lower()
    forms = "e.g. 30, 90s, 10m, 2h" + (" or inf" if allow_inf else "")
    if text in ("inf", "infinity", "forever"):
        if allow_inf:
            return float("inf")
        raise UsageError(f"{option} {value}: give a finite time ({forms}).")
    m = _DURATION.match(text)
    if not m or m.group(2) not in _DURATION_UNITS:
        raise UsageError(f"{option} {value!r} is not a duration: give seconds, or a number with a unit s, m, h or d "
                         f"({forms}).")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if seconds < 0:
        raise UsageError(f"{option} {value}: give {'zero or more' if allow_zero else 'more than zero'} seconds "
                         f"({forms}).")
    if seconds == 0 and not allow_zero:
        raise UsageError(f"{option} {value}: give more than zero seconds ({forms}).")
    return seconds
