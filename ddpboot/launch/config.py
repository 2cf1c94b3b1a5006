"""A launch as the command line asked for it: every option parsed and checked once, into typed values.

The run command (cli/run.py) builds one LaunchConfig before anything starts; the runner (launch/runner.py) plans,
reserves and supervises from it, and turns it into the LaunchSpec the supervisor takes.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.bars import progress_interval
from ddpboot.launch.logs import LogMode, parse_log_mode
from ddpboot.launch.options import (
    Std,
    StdSpec,
    check_rank_filter,
    parse_rank_list,
    parse_rdzv_conf,
    parse_std,
    resolve_std,
)
from ddpboot.launch.preflight import is_module_name
from ddpboot.launch.spec import Routing, StoreBackend, Target, TargetKind
from ddpboot.nodes.check import DEFAULT_JOIN_TIMEOUT
from ddpboot.nodes.launcher import StoreAddress
from ddpboot.nodes.static import NodeSetup
from ddpboot.selection.planner import Plan
from ddpboot.selection.request import Request
from ddpboot.tcpstore.allow import AllowList

DEFAULT_SHUTDOWN_TIMEOUT = 30.0


def target_kind(module: bool, no_python: bool, run_path: bool) -> TargetKind:
    """What SCRIPT is, from -m, --no-python and --run-path (--run-path wins over --no-python, as in torchrun)."""
    if module and no_python:
        raise UsageError("-m/--module and --no-python contradict each other: a module needs Python. Choose one.")
    if run_path and module:
        raise UsageError("--run-path runs a script file; with -m give the module without --run-path.")
    if run_path:
        return "run_path"
    if module:
        return "module"
    return "binary" if no_python else "script"


def check_torchrun_options(max_restarts: int, start_method: str, rdzv_conf: str, rdzv_backend: str) -> None:
    """torchrun's options that ddpboot accepts: their values must be ones torchrun would take."""
    if max_restarts < 0:
        raise UsageError(f"--max-restarts {max_restarts}: give 0 (no restart) or more.")
    if start_method not in ("spawn", "fork", "forkserver"):
        raise UsageError(f"--start-method {start_method!r}: torchrun's choices are spawn, fork and forkserver.")
    parse_rdzv_conf(rdzv_conf)
    backend = rdzv_backend.strip().lower()
    if backend in ("etcd", "etcd-v2"):
        raise UsageError(
            f"--rdzv-backend {rdzv_backend}: ddpboot has no etcd rendezvous and would not use it. A fixed node count "
            "meets at ddpboot's store (--master-addr/--master-port, or --rdzv-backend static); an elastic "
            "--nnodes MIN:MAX runs through torch's c10d rendezvous (--rdzv-backend c10d --rdzv-endpoint HOST:PORT)."
        )
    if backend not in ("static", "c10d"):
        raise UsageError(f"--rdzv-backend {rdzv_backend!r}: ddpboot takes static (the default) or c10d.")


# torchrun options that ddpboot refuses by name, each with what ddpboot does instead (docs/guide.md lists them).
REFUSED_TORCHRUN_OPTIONS = {
    "--numa-binding": "ddpboot does not bind ranks to NUMA nodes as torchrun does; it binds each rank to the CPU "
    "cores near its GPU by default (--cpu-affinity auto). Drop --numa-binding, or choose cores with "
    "--cpu-affinity LIST.",
    "--logs-specs": "ddpboot has no LogsSpecs plugins; it writes each rank's output to --log-dir DIR "
    "(DIR/RUN_ID/attempt_N/rankG.log) and takes -r/--redirects and -t/--tee as torchrun does. Drop "
    "--logs-specs.",
    "--event-log-handler": "ddpboot has no event handler plugins; the launcher reports each failure on stderr. Drop "
    "--event-log-handler.",
    "--duplicate-stdout-filters": "ddpboot does not copy matching output lines to a separate file; it writes each "
    "rank's output under --log-dir DIR, where grep finds them, and --ranks-filter shows only some ranks. Drop "
    "--duplicate-stdout-filters.",
    "--duplicate-stderr-filters": "ddpboot does not copy matching output lines to a separate file; it writes each "
    "rank's output under --log-dir DIR, where grep finds them, and --ranks-filter shows only some ranks. Drop "
    "--duplicate-stderr-filters.",
}


def refuse_torchrun_options(given: Mapping[str, str | None]) -> None:
    """An error naming the first refused torchrun option that was given (a value that is not None)."""
    for option, value in given.items():
        if value is not None:
            raise UsageError(f"{option} {value}: {REFUSED_TORCHRUN_OPTIONS[option]}")


def parse_store_backend(text: str) -> StoreBackend:
    backend = text.strip().lower()
    if backend == "python":
        return "python"
    if backend == "torch":
        return "torch"
    raise UsageError(f"--store {text!r}: choose python (ddpboot's store, the default) or torch.")


def parse_preloads(text: str, fast_start: bool) -> tuple[str, ...]:
    """`--preload mod1,mod2`: module names, imported once by the fast-start process."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names and not fast_start:
        raise UsageError(f"--preload {text}: modules are preloaded only with --fast-start; add --fast-start or drop "
                         "--preload.")
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


@dataclass(frozen=True)
class OutputConfig:
    """Where workers' output goes: -r/--redirects, -t/--tee, --log-dir, the rank filters and the line prefix."""

    log_dir: Path | None = None
    redirects: StdSpec | None = None
    tee: StdSpec | None = None
    local_ranks: frozenset[int] | None = None  # --local-ranks-filter; None: every local rank is shown
    global_ranks: frozenset[int] | None = None  # --ranks-filter
    prefix: bool = True
    log_mode: LogMode = LogMode.PRIVATE  # --log-mode: who may read the run directory and its files

    @classmethod
    def parse(
        cls,
        log_dir: str | None,
        redirects: str | None,
        tee: str | None,
        local_ranks_filter: str | None,
        ranks_filter: str | None,
        prefix: bool,
        log_mode: str = LogMode.PRIVATE.value,
    ) -> OutputConfig:
        """From the options as typed; the rank filters are checked against the plan later, in `routing`."""
        red = parse_std(redirects, "--redirects") if redirects is not None else None
        teed = parse_std(tee, "--tee") if tee is not None else None
        writes = [s for s in (red, teed) if s is not None and s != Std.NONE]
        if writes and not log_dir:
            raise UsageError(
                "-r/--redirects and -t/--tee write worker output to files, which needs --log-dir DIR (torchrun would "
                "use a temporary directory and leave it behind)."
            )
        if log_dir:
            check_log_dir(Path(log_dir))
        progress_interval(os.environ)  # DDPBOOT_PROGRESS_INTERVAL, checked before anything starts (logs.Console)
        return cls(
            log_dir=Path(log_dir) if log_dir else None,
            log_mode=parse_log_mode(log_mode),
            redirects=red,
            tee=teed,
            local_ranks=parse_rank_list(local_ranks_filter, "--local-ranks-filter") if local_ranks_filter else None,
            global_ranks=parse_rank_list(ranks_filter, "--ranks-filter") if ranks_filter else None,
            prefix=prefix,
        )

    def routing(self, plan: Plan) -> Routing:
        """torchrun's rules: redirected streams go to files only, teed ones to files and console. With --log-dir
        and neither option, everything goes to both (torchrun would write nothing). Filters naming ranks the plan
        does not have are errors."""
        n = len(plan.ranks)
        if self.local_ranks is not None:
            check_rank_filter(self.local_ranks, n, "--local-ranks-filter", "local rank")
        if self.global_ranks is not None:
            check_rank_filter(self.global_ranks, plan.world_size, "--ranks-filter", "rank")
        red = resolve_std(self.redirects, n, "--redirects") if self.redirects is not None else {}
        teed = resolve_std(self.tee, n, "--tee") if self.tee is not None else {}
        have_dir = self.log_dir is not None
        files: dict[int, Std] = {}
        console: dict[int, Std] = {}
        for slot in plan.ranks:
            lr = slot.local_rank
            r, t = red.get(lr, Std.NONE), teed.get(lr, Std.NONE)
            if have_dir and self.redirects is None and self.tee is None:
                files[lr] = Std.ALL
            else:
                files[lr] = (r | t) if have_dir else Std.NONE
            console[lr] = Std(Std.ALL & ~(r & ~t)) if self._shown(lr, slot.rank) else Std.NONE
        return Routing(files=files, console=console, prefix=self.prefix)

    def _shown(self, local_rank: int, rank: int) -> bool:
        return (self.local_ranks is None or local_rank in self.local_ranks) and (
            self.global_ranks is None or rank in self.global_ranks)


@dataclass(frozen=True)
class LaunchConfig:
    """One launch, every option parsed and checked; nothing has been started when it exists."""

    target: Target
    python: str  # the interpreter for script, module and run_path targets (PYTHON_EXEC or the launcher's own)
    cwd: Path
    env: Mapping[str, str]  # the launcher's environment, which workers inherit
    nodes: NodeSetup
    store_address: StoreAddress
    request: Request
    store: StoreBackend = "python"
    store_allow: AllowList | None = None  # --store-allow: the addresses the store serves (None: all, or SLURM's)
    signals: tuple[signal.Signals, ...] = ()
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    monitor_interval: float = 0.1
    stall_timeout: float | None = None  # --stall-timeout: dump the stacks and stop after this long without progress
    max_restarts: int = 0
    role: str = "default"
    rdzv_id: str | None = None  # --rdzv-id as given; None or "none": a fresh run id (nodes/launcher.py)
    rdzv_backend: str = "static"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    output: OutputConfig = field(default_factory=OutputConfig)
    fast_start: bool = False
    preloads: tuple[str, ...] = ()  # modules the fast-start process imports before forking the ranks
    wait_for_gpus: float | None = None  # seconds to wait for busy or held GPUs; None: fail at once
    dry_run: bool = False

    @property
    def given_run_id(self) -> str | None:
        """The run id --rdzv-id names, or None for a fresh one (torchrun's default id is the string `none`)."""
        return self.rdzv_id if self.rdzv_id and self.rdzv_id != "none" else None
