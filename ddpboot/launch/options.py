"""Parsing of the launcher's option values: pure functions, each error naming the option, the value and the fix.

torchrun's forms are accepted as they are (`-r 3`, `-t 0:1,1:2`, `--signals-to-handle SIGTERM,SIGINT`), without its
limits: a per-rank map may name any local rank (`0:1,10:2`), not single digits only.
"""

from __future__ import annotations

import re
import signal
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.preflight import is_module_name
from ddpboot.launch.pymain import TargetKind
from ddpboot.launch.spec import PREFIX_FIELDS, Std, StdSpec
from ddpboot.selection.affinity import NumaBinding
from ddpboot.selection.request import SelectionOptions
from ddpboot.units import OptionChoice

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


def parse_prefix_template(text: str, option: str = "--log-line-prefix-template") -> str:
    """torchrun's line prefix template (string.Template: `${name}` or `$name`, `$$` for a `$`), over PREFIX_FIELDS.
    torchrun leaves a name it does not know as it is; here it is an error, so that a typo (`${local_rnak}`) is seen
    before the job runs rather than on every line."""
    names = ", ".join(f"${{{n}}}" for n in PREFIX_FIELDS)
    template = string.Template(text)
    if not template.is_valid():
        raise UsageError(f"{option} {text!r}: a '$' that begins no ${{name}}; write $$ for a '$' of its own. The "
                         f"names are {names}.")
    unknown = [n for n in template.get_identifiers() if n not in PREFIX_FIELDS]
    if unknown:
        raise UsageError(f"{option} {text!r}: unknown name{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(f'${{{n}}}' for n in unknown)}; a prefix can use {names} "
                         f"(e.g. {option} '${{hostname}}:${{rank}}: ').")
    return text


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


class StartMethod(OptionChoice):
    """torchrun's --start-method: checked, and changes nothing (every ddpboot worker is a fresh process). Taken as
    typed, as torchrun takes it."""

    SPAWN = "spawn"
    FORK = "fork"
    FORKSERVER = "forkserver"

    @classmethod
    def normal(cls, text: str | None) -> str:
        return text or ""

    @classmethod
    def refusal(cls, text: str | None, where: str) -> str:
        *first, last = cls.values()
        return f"{where} {text!r}: torchrun's choices are {', '.join(first)} and {last}."


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


def target_kind(module: bool, no_python: bool, run_path: bool) -> TargetKind:
    """What SCRIPT is, from -m, --no-python and --run-path (--run-path wins over --no-python, as in torchrun)."""
    if module and no_python:
        raise UsageError("-m/--module and --no-python contradict each other: a module needs Python. Choose one.")
    if run_path and module:
        raise UsageError("--run-path runs a script file; with -m give the module without --run-path.")
    if run_path:
        return TargetKind.RUN_PATH
    if module:
        return TargetKind.MODULE
    return TargetKind.BINARY if no_python else TargetKind.SCRIPT


# torchrun options that ddpboot refuses by name, each with what ddpboot does instead (docs/guide.md lists them).
REFUSED_TORCHRUN_OPTIONS = {
    "--logs-specs": "ddpboot has no LogsSpecs plugins; it writes each rank's output to --log-dir DIR "
    "(DIR/RUN_ID/attempt_N/rankG.log) and takes -r/--redirects and -t/--tee as torchrun does. Drop "
    "--logs-specs.",
    "--event-log-handler": "ddpboot has no event handler plugins; the launcher reports each failure on stderr. Drop "
    "--event-log-handler, or give torchrun's default, null, which records nothing.",
    "--duplicate-stdout-filters": "ddpboot does not copy matching output lines to a separate file; it writes each "
    "rank's output under --log-dir DIR, where grep finds them, and --ranks-filter shows only some ranks. Drop "
    "--duplicate-stdout-filters.",
    "--duplicate-stderr-filters": "ddpboot does not copy matching output lines to a separate file; it writes each "
    "rank's output under --log-dir DIR, where grep finds them, and --ranks-filter shows only some ranks. Drop "
    "--duplicate-stderr-filters.",
}


ACCEPTED_TORCHRUN_VALUES = {"--event-log-handler": ("null",)}
"""Values of a refused option that ask for nothing ddpboot lacks: torchrun's own default handler, `null`, records
no event, as ddpboot does."""


def numa_selection(text: str, selection: SelectionOptions) -> SelectionOptions:
    """`--numa-binding POLICY`: torchrun's policies, as the request's CPU affinity (selection/affinity.py applies
    them to each rank's own GPU); it chooses each rank's cores, so a --cpu-affinity of one's own contradicts it."""
    mode = NumaBinding.parse(text, "--numa-binding").value
    if selection.cpu_affinity.strip().lower() != "auto":
        raise UsageError(f"--numa-binding {text} and --cpu-affinity {selection.cpu_affinity} both choose each rank's "
                         "cores: give one of them.")
    return replace(selection, cpu_affinity=mode)


def refuse_torchrun_options(given: Mapping[str, str | None]) -> None:
    """An error naming the first refused torchrun option that was given (a value that is not None)."""
    for option, value in given.items():
        if value is not None and value.strip().lower() not in ACCEPTED_TORCHRUN_VALUES.get(option, ()):
            raise UsageError(f"{option} {value}: {REFUSED_TORCHRUN_OPTIONS[option]}")


def parse_preloads(text: str, fast_start: bool) -> tuple[str, ...]:
    """`--preload mod1,mod2`: module names, imported once by the fast-start process."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names and not fast_start:
        raise UsageError(f"--preload {text}: modules are preloaded only with --fast-start or --warm; add one or "
                         "drop --preload.")
    bad = [m for m in names if not is_module_name(m)]
    if bad:
        raise UsageError(f"--preload {text}: {', '.join(map(repr, bad))} is not a module name (dotted identifiers, "
                         "comma-separated: --preload numpy,transformers).")
    return tuple(names)


def check_preloads(names: Sequence[str], search: Sequence[str]) -> None:
    """Each preloaded module's top-level package must be found on `search` (the script's directory, the working
    directory and the interpreter's path) before anything starts: a typo is an error, not a silent fall back to
    starting every rank with exec. Only the top level is looked up, so that nothing (torch above all) is imported."""
    from importlib.machinery import PathFinder

    missing = [m for m in names if PathFinder.find_spec(m.split(".")[0], list(search)) is None
               and m.split(".")[0] not in sys.builtin_module_names]
    if missing:
        raise UsageError(
            f"--preload {','.join(names)}: no module {', '.join(map(repr, missing))} is installed for this Python "
            f"({sys.executable}) or found beside the script. Check the spelling, install it, or drop it from --preload."
        )


def check_log_dir(path: Path) -> None:
    """--log-dir must be a directory or a path where one can be made: an existing file (or a file where a parent
    directory should be) is named as such, rather than as the OS's "File exists" or "Not a directory"."""
    for place in (path, *path.parents):
        if place.exists() and not place.is_dir():
            where = "is a file" if place == path else f"is inside {place}, which is a file"
            raise UsageError(
                f"--log-dir {path} {where}, not a directory. Give a directory (ddpboot creates it if missing), e.g. "
                f"--log-dir {path.with_name(path.name + '-logs') if place == path else Path('logs')}."
            )
        if place.exists():
            return
