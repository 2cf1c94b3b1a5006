"""The run command's own options and arguments, each documented where it is declared (as torchrun's run.py does);
`ddpboot --help` shows them grouped in panels. torchrun's options keep their dash and underscore spellings and their
PET_* environment defaults. The selection options shared with `plan` and `smoke` are in options.py.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Annotated

import typer

from ddpboot.launch.config import DEFAULT_SIGNALS

_PROG = "Job"
_STORE = "Multi-node"
_SUP = "Supervision"
_OUT = "Logs"
_TORCHRUN = "torchrun compatibility"



def _print_version(value: bool) -> None:
    if value:
        # The package's __init__ is loaded already (this module is inside it) and loads the worker API only on
        # first use; looked up by name so the import graph does not show the worker API under the command line.
        print(f"ddpboot {importlib.import_module('ddpboot').__version__}")
        raise typer.Exit(0)


def _print_completion(ctx: typer.Context, value: str | None) -> None:
    if value is not None:  # eager, as --version: SCRIPT is not needed; it prints the script and exits
        from ddpboot.cli.completion import print_completion

        print_completion(ctx, value)


PrintCompletionOption = Annotated[
    str | None,
    typer.Option("--print-completion", is_eager=True, callback=_print_completion, rich_help_panel=_PROG,
                 metavar="SHELL", show_default=False,
                 help="Print a completion script for bash, zsh, tcsh or fish and exit, e.g. "
                 "`eval \"$(ddpboot --print-completion bash)\"` in ~/.bashrc (as torchrun's)."),
]

VersionOption = Annotated[
    bool,
    typer.Option("--version", is_eager=True, callback=_print_version, rich_help_panel=_PROG,
                 help="Print ddpboot's version and exit."),
]

ScriptArgument = Annotated[
    str,
    typer.Argument(
        help="The training script (run as `python -u SCRIPT ARGS` with this interpreter, or PYTHON_EXEC), a "
        "module with -m, or a program with --no-python.",
        show_default=False,
        metavar="SCRIPT",
    ),
]

ArgsArgument = Annotated[
    list[str] | None,
    typer.Argument(help="Passed to the script untouched; `${local_rank}` becomes the node-local index.",
                   metavar="ARGS"),
]

ModuleOption = Annotated[
    bool,
    typer.Option("-m", "--module", envvar="PET_MODULE", rich_help_panel=_PROG,
                 help="SCRIPT is a module name, run as `python -u -m SCRIPT ARGS` from the current directory."),
]

NoPythonOption = Annotated[
    bool,
    typer.Option("--no-python", "--no_python", envvar="PET_NO_PYTHON", rich_help_panel=_PROG,
                 help="SCRIPT is a program (a path, or a name on PATH) executed directly, not a Python script."),
]

RunPathOption = Annotated[
    bool,
    typer.Option("--run-path", "--run_path", envvar="PET_RUN_PATH", rich_help_panel=_TORCHRUN,
                 help="Run SCRIPT through runpy.run_path as __main__ (torchrun's --run-path); each worker is "
                 "still its own process."),
]

FastStartOption = Annotated[
    bool,
    typer.Option("--fast-start/--no-fast-start", envvar="DDPBOOT_FAST_START", rich_help_panel=_PROG,
                 help="Import torch once per node and fork every rank from that process, instead of each rank "
                 "importing torch itself; the script runs exactly as `python -u SCRIPT ARGS` would (see "
                 "docs/reference.md for the few differences). Python scripts and modules only."),
]

PreloadOption = Annotated[
    str,
    typer.Option("--preload", envvar="DDPBOOT_PRELOAD", rich_help_panel=_PROG, metavar="MODULES",
                 help="With --fast-start or --warm: more modules to import once, before forking the ranks "
                 "(mod1,mod2)."),
]

WarmOption = Annotated[
    bool,
    typer.Option("--warm/--no-warm", envvar="DDPBOOT_WARM", rich_help_panel=_PROG,
                 help="Fork the ranks from this user's warm process on this node, which imported torch once and "
                 "is kept between launches (started by the first warm launch; `ddpboot warm status|stop`). As "
                 "--fast-start, without its import on every launch."),
]

WarmIdleOption = Annotated[
    str,
    typer.Option("--warm-idle", envvar="DDPBOOT_WARM_IDLE", rich_help_panel=_PROG, metavar="TIME",
                 help="With --warm: the warm process exits after this long without launches (e.g. 15m, 1h)."),
]

RdzvIdOption = Annotated[
    str | None,
    typer.Option("--rdzv-id", "--rdzv_id", envvar="PET_RDZV_ID", rich_help_panel=_STORE, metavar="ID",
                 help="The job id, given to workers as TORCHELASTIC_RUN_ID and naming the --log-dir "
                 "subdirectory. Default: a fresh id per run."),
]

RdzvConfOption = Annotated[
    str,
    typer.Option("--rdzv-conf", "--rdzv_conf", envvar="PET_RDZV_CONF", rich_help_panel=_TORCHRUN, metavar="K=V,...",
                 help="torchrun's KEY=VALUE,... rendezvous settings: join_timeout (every job with several nodes), "
                 "last_call_timeout, close_timeout and the others of torch's c10d rendezvous (elastic jobs)."),
]

StoreOption = Annotated[
    str,
    typer.Option("--store", envvar="DDPBOOT_STORE", rich_help_panel=_STORE, metavar="python|torch",
                 help="Who serves the store: `python` (ddpboot's implementation of torch's TCPStore protocol, "
                 "no torch import, fastest start) or `torch` (torch's own TCPStore server in the guardian "
                 "process, for a torch whose store protocol ddpboot does not know yet)."),
]

StoreAllowOption = Annotated[
    str | None,
    typer.Option("--store-allow", envvar="DDPBOOT_STORE_ALLOW", rich_help_panel=_STORE, metavar="HOSTS",
                 help="Serve the store only to these hosts: HOST[,HOST...] as addresses, networks (10.0.0.0/8) or "
                 "names. Under SLURM node 0 already serves only the job's nodes; this adds to them. ddpboot's "
                 "store only: refused with --store torch and elastic jobs (docs/security.md)."),
]

MaxRestartsOption = Annotated[
    int,
    typer.Option("--max-restarts", "--max_restarts", envvar="PET_MAX_RESTARTS", rich_help_panel=_SUP,
                 help="Restart every rank up to N times after a failure; TORCHELASTIC_RESTART_COUNT counts the "
                 "attempts and each attempt logs to its own attempt_N directory. The exit code is the last "
                 "attempt's."),
]

ShutdownTimeoutOption = Annotated[
    str | None,
    typer.Option("--shutdown-timeout", "--shutdown_timeout",
                 envvar=["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], rich_help_panel=_SUP,
                 metavar="TIME",
                 help="How long workers get to exit after SIGTERM before SIGKILL, when a rank fails and when the "
                 "launcher is signalled: seconds, or with a unit (90s, 2m). Default 30."),
]

StallTimeoutOption = Annotated[
    str | None,
    typer.Option("--stall-timeout", rich_help_panel=_SUP, metavar="TIME",
                 help="Stop the job when no rank made progress for this long (no output, no rank exited, no rank "
                 "busy on a CPU), after dumping every rank's stack into the log and the run directory: seconds, or "
                 "with a unit (90s, 10m, 2h). Default: never."),
]

GpuWatchOption = Annotated[
    str,
    typer.Option("--gpu-watch", rich_help_panel=_SUP, metavar="warn|strict|off",
                 help="While the job runs, check every few seconds which processes use which GPU: warn when a rank "
                 "(or its DataLoader worker, or a subprocess) holds memory on a GPU that is not its own, or a "
                 "process that is not the job's uses one of its GPUs; strict also ends the job (exit code 125) "
                 "for the first. Default warn."),
]

GpuWatchIntervalOption = Annotated[
    str,
    typer.Option("--gpu-watch-interval", rich_help_panel=_SUP, metavar="TIME",
                 help="How often --gpu-watch reads the GPUs' processes: seconds, or with a unit. Default 5."),
]

MonitorIntervalOption = Annotated[
    str,
    typer.Option("--monitor-interval", "--monitor_interval", envvar="PET_MONITOR_INTERVAL",
                 rich_help_panel=_TORCHRUN, metavar="SECONDS",
                 help="ddpboot sees exits as they happen; this is only how often it re-checks that a stopped "
                 "rank's leftover processes are gone."),
]

SignalsToHandleOption = Annotated[
    str,
    typer.Option("--signals-to-handle", "--signals_to_handle", envvar="PET_SIGNALS_TO_HANDLE",
                 rich_help_panel=_SUP, metavar="SIGNALS",
                 help="Signals forwarded to every worker's process group. INT, TERM, HUP and QUIT also stop the "
                 "job (a second Ctrl-C kills at once). Not forwarded when the sender (SLURM's slurmstepd) "
                 "signals the workers itself, nor twice within 1 s. Others keep their default action."),
]

StartMethodOption = Annotated[
    str,
    typer.Option("--start-method", "--start_method", envvar="PET_START_METHOD", rich_help_panel=_TORCHRUN,
                 metavar="spawn|fork|forkserver",
                 help="torchrun's spawn, fork or forkserver: checked, and changes nothing. torchrun too starts a "
                 "script, module or program as a fresh process whatever it says (it uses it for --run-path only); "
                 "every ddpboot worker is a fresh process (fork+exec), as spawn's are. --fast-start forks ranks "
                 "from one process that imported torch."),
]

RoleOption = Annotated[
    str,
    typer.Option("--role", envvar="PET_ROLE", rich_help_panel=_TORCHRUN, metavar="NAME",
                 help="ROLE_NAME given to the workers, and `${role_name}` in --log-line-prefix-template. As under "
                 "torchrun, it names no file."),
]

WaitForGpusOption = Annotated[
    str | None,
    typer.Option("--wait-for-gpus", envvar="DDPBOOT_WAIT_FOR_GPUS", rich_help_panel=_SUP, metavar="TIME",
                 help="When the GPUs are busy or held by another ddpboot job, wait up to this long (600, 10m, 2h, "
                 "inf) instead of failing."),
]

LogDirOption = Annotated[
    str | None,
    typer.Option("--log-dir", "--log_dir", envvar="PET_LOG_DIR", rich_help_panel=_OUT, metavar="DIR",
                 help="Write each rank's output to DIR/RUN_ID/attempt_N/rankG.log (both streams, unprefixed) "
                 "and its @record traceback to rankG.error.json. Without it nothing is written anywhere."),
]

LogModeOption = Annotated[
    str,
    typer.Option("--log-mode", envvar="DDPBOOT_LOG_MODE", rich_help_panel=_OUT, metavar="private|shared",
                 help="Who may read the run's log directory DIR/RUN_ID: `private` (you only: directories 0700, "
                 "files 0600; the default) or `shared` (as your umask allows). DIR itself keeps its mode."),
]

RedirectsOption = Annotated[
    str | None,
    typer.Option("-r", "--redirects", envvar="PET_REDIRECTS", rich_help_panel=_TORCHRUN, metavar="STREAMS",
                 help="Streams sent to the log files only, not the console: 0 none, 1 stdout, 2 stderr, 3 both; "
                 "per local rank as 0:3,10:2. Without --log-dir the files go under $TMPDIR/ddpboot-logs-UID "
                 "(kept; the launcher names the run's directory)."),
]

TeeOption = Annotated[
    str | None,
    typer.Option("-t", "--tee", envvar="PET_TEE", rich_help_panel=_TORCHRUN, metavar="STREAMS",
                 help="Streams written to the log files and shown (same form as --redirects; without --log-dir, "
                 "files as there). With --log-dir and neither -r nor -t, both streams of every rank are written and "
                 "shown."),
]

LocalRanksFilterOption = Annotated[
    str | None,
    typer.Option("--local-ranks-filter", "--local_ranks_filter", envvar="PET_LOCAL_RANKS_FILTER",
                 rich_help_panel=_TORCHRUN, metavar="RANKS",
                 help="Show only these local ranks on the console (0,2-3); files still get every rank."),
]

RanksFilterOption = Annotated[
    str | None,
    typer.Option("--ranks-filter", envvar="DDPBOOT_RANKS_FILTER", rich_help_panel=_OUT, metavar="RANKS",
                 help="Show only these global ranks on the console (0,8-15); files still get every rank."),
]

NoPrefixOption = Annotated[
    bool,
    typer.Option("--no-prefix", envvar="DDPBOOT_NO_PREFIX", rich_help_panel=_OUT,
                 help="Do not prefix console lines with \\[rankG]:."),
]

LogLinePrefixTemplateOption = Annotated[
    str | None,
    typer.Option("--log-line-prefix-template", "--log_line_prefix_template",
                 envvar=["PET_LOG_LINE_PREFIX_TEMPLATE", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"], rich_help_panel=_OUT,
                 metavar="TEMPLATE", show_default=False,
                 help="What begins each console line instead of \\[rankG]: , from ${rank}, ${local_rank}, "
                 "${node_rank}, ${role_name} (--role) and ${hostname}, e.g. '${hostname}:${rank}: ' (torchrun's, "
                 "with ${node_rank}); used as written, spaces included."),
]

VirtualLocalRankOption = Annotated[
    bool,
    typer.Option("--virtual-local-rank", "--virtual_local_rank", envvar="PET_VIRTUAL_LOCAL_RANK",
                 rich_help_panel=_TORCHRUN, hidden=True,
                 help="torchrun's LOCAL_RANK=0 with one GPU per worker: ddpboot's default (--isolation rank)."),
]

NoNetworkCheckOption = Annotated[
    bool,
    typer.Option("--no-network-check", envvar="DDPBOOT_NO_NETWORK_CHECK", rich_help_panel=_STORE,
                 help="Several nodes: skip the check, at the nodes' check-in, that every node can reach the address "
                 "each node's NCCL or gloo bootstrap would use (docs/clusters.md)."),
]

DryRunOption = Annotated[
    bool,
    typer.Option("--dry-run", rich_help_panel=_OUT,
                 help="Print the plan and each worker's command and the environment variables ddpboot would "
                 "set; start nothing."),
]


NumaBindingOption = Annotated[
    str | None,
    typer.Option("--numa-binding", "--numa_binding", rich_help_panel=_TORCHRUN, metavar="POLICY", show_default=False,
                 help="torchrun's node, socket, exclusive or core-complex, for each rank's own GPU: bind it to the "
                 "cores of its GPU's NUMA node, of its socket, an exclusive share of the node's physical cores, or "
                 "one last-level cache of the node (docs/reference.md); memory is preferred from the same NUMA nodes. "
                 "Instead of --cpu-affinity."),
]


# torchrun options that ddpboot refuses by name (launch/config.py says why and what to use instead): declared so
# that the refusal names them, hidden from --help, listed in docs/guide.md.
LogsSpecsOption = Annotated[str | None, typer.Option("--logs-specs", "--logs_specs", hidden=True)]
EventLogHandlerOption = Annotated[str | None, typer.Option("--event-log-handler", "--event_log_handler", hidden=True)]
DuplicateStdoutFiltersOption = Annotated[
    str | None, typer.Option("--duplicate-stdout-filters", "--duplicate_stdout_filters", hidden=True)
]
DuplicateStderrFiltersOption = Annotated[
    str | None, typer.Option("--duplicate-stderr-filters", "--duplicate_stderr_filters", hidden=True)
]

REFUSED = {
    "logs_specs": LogsSpecsOption,
    "event_log_handler": EventLogHandlerOption,
    "duplicate_stdout_filters": DuplicateStdoutFiltersOption,
    "duplicate_stderr_filters": DuplicateStderrFiltersOption,
}
"""torchrun's options ddpboot refuses by name, by RunOptions field (the refusal names the option as typed)."""

JsonOption = Annotated[
    bool,
    typer.Option("--json", rich_help_panel=_OUT,
                 help="With --dry-run: print the dry run as one JSON object (the plan, the store, each worker's "
                 "command and variables)."),
]



def _param(name: str, annotation: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


RUN_PARAMS = [
    _param("module", ModuleOption, False),
    _param("no_python", NoPythonOption, False),
    _param("run_path", RunPathOption, False),
    _param("fast_start", FastStartOption, False),
    _param("preload", PreloadOption, ""),
    _param("warm", WarmOption, False),
    _param("warm_idle", WarmIdleOption, "15m"),
    _param("rdzv_id", RdzvIdOption, None),
    _param("rdzv_conf", RdzvConfOption, ""),
    _param("store", StoreOption, "python"),
    _param("store_allow", StoreAllowOption, None),
    _param("max_restarts", MaxRestartsOption, 0),
    _param("shutdown_timeout", ShutdownTimeoutOption, None),
    _param("monitor_interval", MonitorIntervalOption, "0.1"),
    _param("stall_timeout", StallTimeoutOption, None),
    _param("gpu_watch", GpuWatchOption, "warn"),
    _param("gpu_watch_interval", GpuWatchIntervalOption, "5"),
    _param("signals_to_handle", SignalsToHandleOption, DEFAULT_SIGNALS),
    _param("start_method", StartMethodOption, "spawn"),
    _param("role", RoleOption, "default"),
    _param("wait_for_gpus", WaitForGpusOption, None),
    _param("log_dir", LogDirOption, None),
    _param("log_mode", LogModeOption, "private"),
    _param("redirects", RedirectsOption, None),
    _param("tee", TeeOption, None),
    _param("local_ranks_filter", LocalRanksFilterOption, None),
    _param("ranks_filter", RanksFilterOption, None),
    _param("no_prefix", NoPrefixOption, False),
    _param("log_line_prefix_template", LogLinePrefixTemplateOption, None),
    _param("virtual_local_rank", VirtualLocalRankOption, False),
    _param("numa_binding", NumaBindingOption, None),
    _param("no_network_check", NoNetworkCheckOption, False),
    _param("dry_run", DryRunOption, False),
    _param("as_json", JsonOption, False),
    _param("version", VersionOption, False),
    _param("print_completion", PrintCompletionOption, None),
    *(_param(name, annotation, None) for name, annotation in REFUSED.items()),
]
"""The run command's own options, named as RunOptions' fields (launch/config.py), in the order --help shows them
within their panels."""

