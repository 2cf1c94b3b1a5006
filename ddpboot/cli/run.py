"""`ddpboot [OPTIONS] SCRIPT [ARGS...]`: run SCRIPT as a DDP job on the planned ranks.

Option parsing stops at SCRIPT: everything after it is passed to the script untouched (`ddpboot --nproc 2 train.py
--epochs 3` gives the script `--epochs 3`). torchrun's options are accepted under their dash and underscore
spellings, with their PET_* environment defaults, and mean the same thing (run_options.py declares them).

Every check that can fail because of what was asked runs before anything starts: a bad option, a missing script or
module, a port in use, an impossible plan all exit 2 with one message, and no process is left behind. The options
become one LaunchConfig here, once; launch/runner.py runs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from ddpboot.cli.options import Selection, selection_request, with_selection
from ddpboot.cli.output import handle_errors
from ddpboot.cli.render import render_dry_run
from ddpboot.cli.run_options import (
    ArgsArgument,
    DryRunOption,
    DuplicateStderrFiltersOption,
    DuplicateStdoutFiltersOption,
    EventLogHandlerOption,
    FastStartOption,
    LocalAddrOption,
    LocalRanksFilterOption,
    LogDirOption,
    LogModeOption,
    LogsSpecsOption,
    MasterAddrOption,
    MasterPortOption,
    MaxRestartsOption,
    ModuleOption,
    MonitorIntervalOption,
    NoPrefixOption,
    NoPythonOption,
    NumaBindingOption,
    OversubscribeOption,
    PreloadOption,
    RanksFilterOption,
    RdzvBackendOption,
    RdzvConfOption,
    RdzvEndpointOption,
    RdzvIdOption,
    RedirectsOption,
    RoleOption,
    RunPathOption,
    ScriptArgument,
    ShutdownTimeoutOption,
    SignalsToHandleOption,
    StallTimeoutOption,
    StandaloneOption,
    StartMethodOption,
    StoreAllowOption,
    StoreOption,
    TeeOption,
    VersionOption,
    VirtualLocalRankOption,
    WaitForGpusOption,
)
from ddpboot.cli.tools import COMMANDS, INDEX_RULES
from ddpboot.errors import UsageError
from ddpboot.launch import runner
from ddpboot.launch.config import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    LaunchConfig,
    OutputConfig,
    check_preloads,
    check_torchrun_options,
    parse_preloads,
    parse_store_backend,
    refuse_torchrun_options,
    target_kind,
)
from ddpboot.launch.faststart import supports
from ddpboot.launch.options import DEFAULT_SIGNALS, parse_duration, parse_rdzv_conf, parse_signals
from ddpboot.launch.preflight import check_python, check_rank_count, check_target
from ddpboot.launch.spec import Target
from ddpboot.nodes.check import join_timeout
from ddpboot.nodes.launcher import NodeOptions, launcher_nodes, store_address
from ddpboot.nodes.store_allow import parse_store_allow
from ddpboot.selection.reserve import parse_wait

run_app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    help="Run SCRIPT (with ARGS) as a DDP job: one worker per rank on exactly the planned GPUs, with torchrun's "
    "environment, supervised (fail-fast, signals, no orphans). `ddpboot plan` shows the plan without running; "
    "`ddpboot gpus` lists GPUs.",
)


@run_app.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=INDEX_RULES,
    help="Run SCRIPT as a DDP job on the planned GPUs (see `ddpboot plan`); exit with the failing rank's code.\n\n"
    + COMMANDS,
    no_args_is_help=True,
)
@handle_errors
@with_selection
def run(
    selection: Selection,
    script: ScriptArgument,
    args: ArgsArgument = None,
    module: ModuleOption = False,
    no_python: NoPythonOption = False,
    run_path: RunPathOption = False,
    fast_start: FastStartOption = False,
    preload: PreloadOption = "",
    master_addr: MasterAddrOption = None,
    master_port: MasterPortOption = None,
    rdzv_backend: RdzvBackendOption = "static",
    rdzv_endpoint: RdzvEndpointOption = "",
    rdzv_id: RdzvIdOption = None,
    rdzv_conf: RdzvConfOption = "",
    standalone: StandaloneOption = False,
    local_addr: LocalAddrOption = None,
    store: StoreOption = "python",
    store_allow: StoreAllowOption = None,
    max_restarts: MaxRestartsOption = 0,
    shutdown_timeout: ShutdownTimeoutOption = None,
    monitor_interval: MonitorIntervalOption = 0.1,
    stall_timeout: StallTimeoutOption = None,
    signals_to_handle: SignalsToHandleOption = DEFAULT_SIGNALS,
    start_method: StartMethodOption = "spawn",
    role: RoleOption = "default",
    wait_for_gpus: WaitForGpusOption = None,
    log_dir: LogDirOption = None,
    log_mode: LogModeOption = "private",
    redirects: RedirectsOption = None,
    tee: TeeOption = None,
    local_ranks_filter: LocalRanksFilterOption = None,
    ranks_filter: RanksFilterOption = None,
    no_prefix: NoPrefixOption = False,
    virtual_local_rank: VirtualLocalRankOption = False,
    dry_run: DryRunOption = False,
    version: VersionOption = False,
    oversubscribe: OversubscribeOption = False,
    numa_binding: NumaBindingOption = None,
    logs_specs: LogsSpecsOption = None,
    event_log_handler: EventLogHandlerOption = None,
    duplicate_stdout_filters: DuplicateStdoutFiltersOption = None,
    duplicate_stderr_filters: DuplicateStderrFiltersOption = None,
) -> None:
    """Run SCRIPT as a DDP job on the planned GPUs (see `ddpboot plan`); exit with the failing rank's code."""
    del version  # --version is eager: it printed and exited before this runs
    env, cwd = dict(os.environ), Path.cwd()
    try:
        # The launcher's own options: cheap checks first, nothing touched yet.
        refuse_torchrun_options({
            "--numa-binding": numa_binding, "--logs-specs": logs_specs, "--event-log-handler": event_log_handler,
            "--duplicate-stdout-filters": duplicate_stdout_filters,
            "--duplicate-stderr-filters": duplicate_stderr_filters,
        })
        kind = target_kind(module, no_python, run_path)
        if virtual_local_rank and selection.isolation.strip().lower() == "node":
            raise UsageError("--virtual-local-rank (LOCAL_RANK=0, one GPU per worker) contradicts --isolation node.")
        backend = parse_store_backend(store)
        signals = parse_signals(signals_to_handle)
        if not dry_run:
            runner.block_early(signals)
        shutdown = parse_duration(DEFAULT_SHUTDOWN_TIMEOUT if shutdown_timeout is None else shutdown_timeout,
                                  "--shutdown-timeout")
        monitor = parse_duration(monitor_interval, "--monitor-interval", allow_zero=False)
        stall = None if stall_timeout is None else parse_duration(stall_timeout, "--stall-timeout", allow_zero=False)
        check_torchrun_options(max_restarts, start_method, rdzv_conf, rdzv_backend)
        node_options = NodeOptions(selection.nnodes, selection.node_rank, master_addr, master_port, rdzv_endpoint,
                                   rdzv_backend, standalone, local_addr)
        nodes = launcher_nodes(node_options, env, max_restarts, ranks_filter)
        store_addr = store_address(nodes, node_options)
        allow = parse_store_allow(store_allow, nodes, backend)
        conf = parse_rdzv_conf(rdzv_conf)
        join = join_timeout(conf)
        output = OutputConfig.parse(log_dir, redirects, tee, local_ranks_filter, ranks_filter, not no_prefix,
                                    log_mode)
        python = check_python(env)
        target = check_target(Target(kind, script, tuple(args or ())), python, env, cwd)
        preloads = parse_preloads(preload, fast_start)
        if preloads and python == sys.executable:  # another interpreter has its own path: it checks at start
            script_dir = str((cwd / script).parent) if kind == "script" else str(cwd)
            check_preloads(preloads, [script_dir, str(cwd), *sys.path])
        forks = fast_start and _forks(target, script)
        wait = None if dry_run else parse_wait(wait_for_gpus)  # a dry run does not wait
        request = selection_request(selection, nodes)
        if isinstance(request.nproc, int) and not dry_run:  # a dry run starts nothing: it shows any count
            check_rank_count(request.nproc, oversubscribe)
        config = LaunchConfig(
            target=target, python=python, cwd=cwd, env=env, nodes=nodes, store_address=store_addr,
            request=request, store=backend, store_allow=allow, signals=signals, shutdown_timeout=shutdown,
            monitor_interval=monitor, stall_timeout=stall, max_restarts=max_restarts, role=role, rdzv_id=rdzv_id,
            rdzv_backend=rdzv_backend, rdzv_conf=conf, join_timeout=join, output=output, fast_start=forks,
            preloads=preloads, wait_for_gpus=wait, dry_run=dry_run,
        )
        code = _dry_run(config) if dry_run else runner.run(config)
    except KeyboardInterrupt:  # Ctrl-C while planning or waiting for GPUs: nothing was started
        print("ddpboot: interrupted before anything started", file=sys.stderr)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def _forks(target: Target, script: str) -> bool:
    """Whether --fast-start can fork this target's ranks (Python only); says so when it cannot."""
    if supports(target):
        return True
    print(f"ddpboot: note: --fast-start forks Python ranks; {script} is a program (--no-python), so every rank "
          "starts with exec as usual", file=sys.stderr, flush=True)
    return False


def _dry_run(config: LaunchConfig) -> int:
    """Print the plan, the store and each worker's command and variables; start nothing."""
    plan = runner.preview_plan(config.request, config.nodes, config.env)
    spec = runner.launch_spec(config, plan)
    if config.fast_start:
        preloads = f" and {', '.join(config.preloads)}" if config.preloads else ""
        print(f"fast start: one process imports torch{preloads} with {config.python}, then forks every rank")
    runner.check_store_port(config)
    render_dry_run(plan, spec, config.env)
    return 0
