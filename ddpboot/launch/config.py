"""A launch as the command line asked for it: the raw options (`RunOptions`, what the command line hands over) and
the one place that turns them into a checked, frozen `LaunchConfig` (`build`). `ddpboot plan`, `smoke` and the
pytest plugin go through the same steps for the part they share (`build_plan`), so that `plan`, `--dry-run` and a
real run agree on the nodes, the request and what this machine can run.

`build` runs in this order, and every step that can fail because of what was asked raises a UsageError (exit 2,
nothing started):

1. torchrun options ddpboot refuses, by name, with what to use instead;
2. what SCRIPT is (`-m`, `--no-python`, `--run-path`) and options that contradict each other;
3. the values that need nothing else: store backend, signals, durations, restarts, start method, rendezvous
   settings (`--rdzv-conf`, once), the preloads' syntax, the output options (-r/-t, which without --log-dir write
   under the temporary log base, rundir.temporary_log_base; the line prefix: --no-prefix, --log-line-prefix-template
   or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, filled with --role and this host's name), `--wait-for-gpus`,
   `--numa-binding` (as the request's CPU affinity, which it contradicts when given);
4. the node setup (flags > MPI, jsrun, SLURM, pbsdsh > a PyTorchJob pod > one node; for several nodes the master
   address must resolve: a DNS lookup of at most 5 s), the store's address and allow-list, the run id;
5. the program: the interpreter (PYTHON_EXEC), the script, module or binary, the preloaded modules;
6. the request for this node, and whether this machine can run that many ranks.

A value that came from the environment (torchrun's PET_* variables, DDPBOOT_*) rather than the command line is
named as such in the error. Nothing here starts a process, takes a lock or changes the signal mask: that is the
runner's (launch/runner.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpboot.contract import Isolation
from ddpboot.errors import UsageError
from ddpboot.launch.bars import progress_interval
from ddpboot.launch.options import (
    DEFAULT_SIGNALS,
    StartMethod,
    check_log_dir,
    check_preloads,
    check_rank_filter,
    numa_selection,
    parse_prefix_template,
    parse_preloads,
    parse_rank_list,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    refuse_torchrun_options,
    resolve_std,
    target_kind,
)
from ddpboot.launch.paths import temp_dir_note
from ddpboot.launch.preflight import check_python, check_rank_count, check_target
from ddpboot.launch.procs.signals import keep_nohup
from ddpboot.launch.rundir import temporary_log_base
from ddpboot.launch.spec import (
    DEFAULT_PREFIX_TEMPLATE,
    LinePrefix,
    LogMode,
    Routing,
    Std,
    StdSpec,
    StoreBackend,
    Supervision,
    Target,
    WatchMode,
)
from ddpboot.nodes.check import join_timeout
from ddpboot.nodes.hostfile import HostOptions
from ddpboot.nodes.launcher import NodeOptions, StoreAddress, job_run_id, launcher_nodes, store_address
from ddpboot.nodes.outcome import LinkTiming, link_timing
from ddpboot.nodes.static import NodeSetup, RdzvBackend
from ddpboot.nodes.store_allow import parse_store_allow
from ddpboot.selection.planner import Plan
from ddpboot.selection.request import NPROC_MODES, Request, SelectionOptions, parse_selection
from ddpboot.selection.reserve import parse_wait
from ddpboot.tcpstore.allow import AllowList
from ddpboot.units import parse_duration

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "DEFAULT_SIGNALS",
    "NPROC_MODES",
    "HostOptions",
    "LaunchConfig",
    "LogMode",
    "NodeOptions",
    "OutputConfig",
    "PlanConfig",
    "RdzvBackend",
    "Request",
    "RunOptions",
    "SelectionOptions",
    "StartMethod",
    "StoreBackend",
    "WatchMode",
    "build",
    "build_plan",
    "parse_selection",
]

DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # --shutdown-timeout's, as torchrun's


@dataclass(frozen=True)
class RunOptions:
    """The run command's options as typed: strings and flags, None where an option was not given. `from_env` maps
    an option (`--nnodes`) to the environment variable its value came from (`PET_NNODES`)."""

    script: str
    args: tuple[str, ...] = ()
    selection: SelectionOptions = field(default_factory=SelectionOptions)
    nodes: NodeOptions = field(default_factory=NodeOptions)
    hosts: HostOptions = field(default_factory=HostOptions)  # --hostfile / --hosts: launch/remote.py runs them
    module: bool = False
    no_python: bool = False
    run_path: bool = False
    fast_start: bool = False
    preload: str = ""
    warm: bool = False
    warm_idle: str | float = "15m"
    store: str = StoreBackend.PYTHON.value
    store_allow: str | None = None
    max_restarts: int = 0
    shutdown_timeout: str | float | None = None  # None: DEFAULT_SHUTDOWN_TIMEOUT
    monitor_interval: str | float = "0.1"
    stall_timeout: str | float | None = None
    gpu_watch: str = WatchMode.WARN.value
    gpu_watch_interval: str | float = "5"
    straggler_window: str | float = "10"
    signals_to_handle: str = DEFAULT_SIGNALS
    start_method: str = StartMethod.SPAWN.value
    role: str = "default"
    rdzv_id: str | None = None
    rdzv_conf: str = ""
    wait_for_gpus: str | None = None
    log_dir: str | None = None
    log_mode: str = LogMode.PRIVATE.value
    redirects: str | None = None
    tee: str | None = None
    local_ranks_filter: str | None = None
    ranks_filter: str | None = None
    no_prefix: bool = False
    no_collapse: bool = False
    log_line_prefix_template: str | None = None  # also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (cli/run_options.py)
    virtual_local_rank: bool = False
    numa_binding: str | None = None  # torchrun's NUMA policy, as the request's CPU affinity
    no_network_check: bool = False  # --no-network-check: the nodes' check-in skips nodes/netprobe.py's check
    dry_run: bool = False
    refused: Mapping[str, str | None] = field(default_factory=dict)  # torchrun options ddpboot refuses, as given
    from_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputConfig:
    """Where workers' output goes: -r/--redirects, -t/--tee, --log-dir, the rank filters and the line prefix."""

    log_dir: Path | None = None  # --log-dir, or the temporary log base where -r/-t write without it
    redirects: StdSpec | None = None
    tee: StdSpec | None = None
    local_ranks: frozenset[int] | None = None  # --local-ranks-filter; None: every local rank is shown
    global_ranks: frozenset[int] | None = None  # --ranks-filter
    prefix: LinePrefix | None = field(default_factory=LinePrefix)  # None: --no-prefix
    log_mode: LogMode = LogMode.PRIVATE  # --log-mode: who may read the run directory and its files
    collapse: bool = True  # False: --no-collapse

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
        template: str | None = None,
        role: str = "default",
        collapse: bool = True,
    ) -> OutputConfig:
        """From the options as typed; the rank filters are checked against the plan later, in `routing`. -r/-t
        that write files without --log-dir write them under the temporary log base, as torchrun writes them to a
        temporary directory; an empty template is ddpboot's own prefix, as torchrun's is its own."""
        red = parse_std(redirects, "--redirects") if redirects is not None else None
        teed = parse_std(tee, "--tee") if tee is not None else None
        writes = [s for s in (red, teed) if s is not None and s != Std.NONE]
        if log_dir:
            check_log_dir(Path(log_dir))
        base = Path(log_dir) if log_dir else temporary_log_base() if writes else None
        progress_interval(os.environ)  # DDPBOOT_PROGRESS_INTERVAL, checked before anything starts (logs.Console)
        line = LinePrefix(parse_prefix_template(template) if template else DEFAULT_PREFIX_TEMPLATE, role,
                          socket.gethostname())
        return cls(
            log_dir=base,
            log_mode=LogMode.parse(log_mode, "--log-mode"),
            redirects=red,
            tee=teed,
            local_ranks=parse_rank_list(local_ranks_filter, "--local-ranks-filter") if local_ranks_filter else None,
            global_ranks=parse_rank_list(ranks_filter, "--ranks-filter") if ranks_filter else None,
            prefix=line if prefix else None,
            collapse=collapse,
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
        return Routing(files=files, console=console, prefix=self.prefix, collapse=self.collapse)

    def _shown(self, local_rank: int, rank: int) -> bool:
        return (self.local_ranks is None or local_rank in self.local_ranks) and (
            self.global_ranks is None or rank in self.global_ranks)


@dataclass(frozen=True)
class PlanConfig:
    """What `ddpboot plan` and `smoke` need, built by the same steps as a run's: the node setup, the store's
    address and the request for this node, checked against what this machine can run."""

    env: Mapping[str, str]
    nodes: NodeSetup
    store_address: StoreAddress
    request: Request


@dataclass(frozen=True)
class LaunchConfig(Supervision):
    """One launch, every option parsed and checked; nothing has been started when it exists. Build it with
    `build` (the command line, the pytest plugin's per-test launcher): it has no defaults of its own."""

    target: Target
    python: str  # the interpreter for script, module and run_path targets (PYTHON_EXEC or the launcher's own)
    cwd: Path
    env: Mapping[str, str]  # the launcher's environment, which workers inherit
    nodes: NodeSetup
    store_address: StoreAddress
    request: Request
    run_id: str  # TORCHELASTIC_RUN_ID, the --log-dir folder and the elastic rendezvous id (nodes/launcher.py)
    store_allow: AllowList | None  # --store-allow: the addresses the store serves (None: all, or SLURM's)
    rdzv_conf: Mapping[str, str]
    join_timeout: float
    link_timing: LinkTiming  # the node links' beat (--rdzv-conf keep_alive_*)
    output: OutputConfig
    fast_start: bool  # the ranks are forked by a process that imported torch (a fast start or warm)
    preloads: tuple[str, ...]  # modules the fast-start process imports before forking the ranks
    warm: bool  # forked by this user's warm process (kept between launches), started if there is none
    warm_idle: float  # --warm-idle: the warm process exits after this long without launches
    wait_for_gpus: float | None  # seconds to wait for busy or held GPUs; None: fail at once
    network_check: bool  # the nodes' check-in checks their bootstrap addresses (nodes/netprobe.py)
    dry_run: bool
    notes: tuple[str, ...]  # what the launcher says before it starts (a note each)


def build_plan(
    selection: SelectionOptions,
    node_options: NodeOptions,
    env: Mapping[str, str],
    *,
    max_restarts: int = 0,
    ranks_filter: str | None = None,
    from_env: Mapping[str, str] | None = None,
    forked: bool = False,
) -> PlanConfig:
    """Steps 4 and 6 of `build` (the module docstring): the node setup, the store's address, the request.
    `forked`: the ranks are forked by a fast-start or warm process (one more process of the user's)."""
    with _named_sources(from_env or {}, env):
        nodes = launcher_nodes(node_options, env, max_restarts, ranks_filter)
        address = store_address(nodes, node_options)
        request = parse_selection(selection, nodes.nnodes, nodes.node_rank)
        if isinstance(request.nproc, int):
            check_rank_count(request.nproc, selection.oversubscribe, forked)
        return PlanConfig(env, nodes, address, request)


def _fast_start_supports(target: Target) -> bool:
    """Imported when asked: `ddpboot plan` and a run without --fast-start need none of fast start's modules."""
    from ddpboot.launch.faststart import supports

    return supports(target)


def _isolation(text: str) -> Isolation | None:
    """The mode asked for, or None when the text is no mode (parse_selection says so, at step 6)."""
    try:
        return Isolation.parse(text)
    except ValueError:
        return None


def supervision(o: RunOptions) -> Supervision:
    """Step 3's values that every attempt is supervised by: the store backend, signals, durations, restarts, the GPU
    watch (`build` calls it; a test gets the command line's defaults from `supervision(RunOptions(script=...))`)."""
    store = StoreBackend.parse(o.store, "--store")
    signals = parse_signals(o.signals_to_handle)
    if o.signals_to_handle == DEFAULT_SIGNALS:  # a list the user gave is taken as given
        signals = keep_nohup(signals)
    shutdown = parse_duration(DEFAULT_SHUTDOWN_TIMEOUT if o.shutdown_timeout is None else o.shutdown_timeout,
                              "--shutdown-timeout")
    monitor = parse_duration(o.monitor_interval, "--monitor-interval", allow_zero=False)
    stall = None if o.stall_timeout is None else parse_duration(o.stall_timeout, "--stall-timeout", allow_zero=False)
    watch = WatchMode.parse(o.gpu_watch, "--gpu-watch")
    watch_every = parse_duration(o.gpu_watch_interval, "--gpu-watch-interval", allow_zero=False)
    if o.max_restarts < 0:
        raise UsageError(f"--max-restarts {o.max_restarts}: give 0 (no restart) or more.")
    return Supervision(role=o.role, max_restarts=o.max_restarts, shutdown_timeout=shutdown, monitor_interval=monitor,
                       stall_timeout=stall, gpu_watch=watch, gpu_watch_interval=watch_every, signals=signals,
                       store=store, straggler_window=parse_duration(o.straggler_window, "--straggler-window"))


def build(options: RunOptions, env: Mapping[str, str], cwd: Path) -> LaunchConfig:
    """The LaunchConfig for these options, in the order the module docstring gives."""
    o = options
    with _named_sources(o.from_env, env):
        refuse_torchrun_options(o.refused)  # 1
        kind = target_kind(o.module, o.no_python, o.run_path)  # 2
        if o.virtual_local_rank and _isolation(o.selection.isolation) is Isolation.NODE:
            raise UsageError("--virtual-local-rank (LOCAL_RANK=0, one GPU per worker) contradicts --isolation node.")
        supervised = supervision(o)  # 3
        StartMethod.parse(o.start_method, "--start-method")
        conf = parse_rdzv_conf(o.rdzv_conf)
        preloads = parse_preloads(o.preload, o.fast_start or o.warm)
        warm_idle = parse_duration(o.warm_idle, "--warm-idle", allow_zero=False)
        if o.no_prefix and o.log_line_prefix_template and "--log-line-prefix-template" not in o.from_env:
            raise UsageError("--no-prefix and --log-line-prefix-template contradict each other: drop one.")
        output = OutputConfig.parse(o.log_dir, o.redirects, o.tee, o.local_ranks_filter, o.ranks_filter,
                                    not o.no_prefix, o.log_mode, o.log_line_prefix_template, o.role,
                                    collapse=not o.no_collapse)
        wait = None if o.dry_run else parse_wait(o.wait_for_gpus)  # a dry run does not wait
        selection = o.selection if o.numa_binding is None else numa_selection(o.numa_binding, o.selection)
        step = repr((o.script, o.args, o.selection, o.module, o.no_python))  # a pbsdsh step's command (its port)
        planned = build_plan(selection, replace(o.nodes, step=step), env, max_restarts=o.max_restarts,  # 4 and 6
                             ranks_filter=o.ranks_filter, from_env=o.from_env, forked=o.fast_start or o.warm)
        nodes = planned.nodes
        allow = parse_store_allow(o.store_allow, nodes, supervised.store)
        python = check_python(env)  # 5
        target = check_target(Target(kind, o.script, o.args), python, env, cwd)
        if preloads and python == sys.executable:  # another interpreter has its own path: it checks at start
            script_dir = str((cwd / o.script).parent) if kind == "script" else str(cwd)
            check_preloads(preloads, [script_dir, str(cwd), *sys.path])
        fast = (o.fast_start or o.warm) and _fast_start_supports(target)
        return LaunchConfig(
            **supervised.shared(), target=target, python=python, cwd=cwd, env=env, nodes=nodes,
            store_address=planned.store_address, request=planned.request, run_id=job_run_id(o.rdzv_id, nodes, env),
            store_allow=allow, rdzv_conf=conf, join_timeout=join_timeout(conf), link_timing=link_timing(conf),
            output=output, fast_start=fast, preloads=preloads, warm=fast and o.warm, warm_idle=warm_idle,
            wait_for_gpus=wait, network_check=not o.no_network_check, dry_run=o.dry_run,
            notes=_notes(o, fast, env),
        )


def _notes(o: RunOptions, fast: bool, env: Mapping[str, str]) -> tuple[str, ...]:
    """What the launcher says before it starts: a fast start that cannot fork this target, a deep TMPDIR."""
    notes: list[str] = []
    if (o.fast_start or o.warm) and not fast:
        notes.append(f"{'--warm' if o.warm else '--fast-start'} forks Python ranks; {o.script} is a program "
                     "(--no-python), so every rank starts with exec as usual")
    deep = temp_dir_note(env)
    if deep is not None:
        notes.append(deep)
    return tuple(notes)


@contextlib.contextmanager
def _named_sources(from_env: Mapping[str, str], env: Mapping[str, str]) -> Iterator[None]:
    """A UsageError about an option whose value came from the environment says so: a user who never typed
    `--nnodes 2` learns that PET_NNODES=2 did."""
    try:
        yield
    except UsageError as exc:
        text = str(exc)
        named = [f"{option} came from {var}={env.get(var, '')} in the environment"
                 for option, var in from_env.items()
                 if re.search(rf"(^|[\s(]){re.escape(option)}\b", text) and var not in text]
        if named:
            exc.args = (f"{text.rstrip()} (Not typed on the command line: {'; '.join(named)}. Unset it, or give the "
                        "option explicitly.)",)
        raise
