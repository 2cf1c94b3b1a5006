"""Typer's value coercion without pydantic where the answer is known: an option left out, a string for a `str`
option, strings for a `list[str]` one, a plain decimal for an `int` one.

Typer from 0.22 on coerces every option's value through a pydantic TypeAdapter it builds on the option's first
use, the options left out included (`None` → `None`): importing pydantic and building the adapters is most of what
`ddpboot plan` took. `install` gives each option a coercion that answers those cases itself, exactly as the adapter
would, and leaves every other value (a float, a word for a bool option read from a variable, a malformed number:
whatever could be refused) to typer's own adapter, built then, so a refusal reads as before. A typer without that
layer (before 0.22: plain click types) is left alone.
"""

from __future__ import annotations

import re
from typing import Any

_DECIMAL = re.compile(r"(0|[1-9][0-9]{0,17})")  # what int() and pydantic read alike, far from any size limit


class KnownCoercion:
    """One option's coercion: the cases with a known answer here, typer's own (`build()`) for the rest."""

    def __init__(self, descriptor: Any, build: Any) -> None:
        self.descriptor = descriptor
        self.build = build
        self.real: Any = None
        info = descriptor.parameter_info
        plain = (info.parser is None and descriptor.file_annotation is None and not descriptor.is_choice
                 and not descriptor.is_path and info.min is None and info.max is None)
        self.kind: Any = descriptor.annotation if plain else None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:  # left out: what typer's RuntimeParam.coerce answers before any adapter
            return () if multi else None
        known = self._known(value, multi)
        if known is not None:
            return known[0]
        if self.real is None:
            self.real = self.build(self.descriptor)
        return self.real.coerce(value, param=param, ctx=ctx)

    def _known(self, value: Any, multi: bool) -> tuple[Any] | None:
        """(the value typer's adapter would give,) or None where only the adapter can say."""
        if self.kind is str and type(value) is str and not multi:
            return (value,)
        if self.kind == list[str] and multi and type(value) in (list, tuple) and all(type(v) is str for v in value):
            return (list(value),)
        if self.kind is int and not multi:
            if type(value) is int:
                return (value,)
            if type(value) is str and _DECIMAL.fullmatch(value):
                return (int(value),)
        return None


def install() -> bool:
    """Give typer's options the coercion above; False where this typer has no pydantic layer to spare."""
    try:
        from typer import core
    except ImportError:
        return False
    build = getattr(core, "build_runtime_param", None)
    if build is None or not hasattr(core, "_TyperParameter"):
        return False
    if getattr(build, "known_coercion", False):
        return True

    def known_first(descriptor: Any) -> KnownCoercion:
        return KnownCoercion(descriptor, build)

    known_first.known_coercion = True  # type: ignore[attr-defined]
    known_first.typer_own = build  # type: ignore[attr-defined]
    core.build_runtime_param = known_first  # type: ignore[attr-defined,assignment]
    return True
