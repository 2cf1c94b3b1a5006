"""The run command's own options, one row each (cli/options.py says what a row holds), documented where they are
declared (as torchrun's run.py does); `ddpboot --help` shows them grouped in panels. torchrun's options keep their
dash and underscore spellings and their PET_* environment defaults. The selection, node and host options shared with
`plan` and `smoke` are in options.py.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated

import typer

from ddpboot.cli.completion import SHELLS
from ddpboot.cli.options import OptionGroup, opt
from ddpboot.launch.config import DEFAULT_SHUTDOWN_TIMEOUT, RunOptions, StartMethod
from ddpboot.launch.spec import LogMode, Std, StoreBackend, WatchMode
from ddpboot.selection.affinity import NumaBinding

_PROG = "Job"
_STORE = "Multi-node"
_SUP = "Supervision"
_OUT = "Logs"
_TORCHRUN = "torchrun compatibility"
_STREAMS = [str(n) for n in range(Std.ALL + 1)]  # -r/-t's values for every rank: 0 none, 1 out, 2 err, 3 both


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


RUN = OptionGroup("own", RunOptions, [
    opt("module", "-m", "--module", env="PET_MODULE", panel=_PROG,
        help="SCRIPT is a module name, run as `python -u -m SCRIPT ARGS` from the current directory."),
    opt("no_python", "--no-python", "--no_python", env="PET_NO_PYTHON", panel=_PROG,
        help="SCRIPT is a program (a path, or a name on PATH) executed directly, not a Python script."),
    opt("run_path", "--run-path", "--run_path", env="PET_RUN_PATH", panel=_TORCHRUN,
        help="Run SCRIPT through runpy.run_path as __main__ (torchrun's --run-path); each worker is still its own "
        "process."),
    opt("fast_start", "--fast-start/--no-fast-start", env="DDPBOOT_FAST_START", panel=_PROG,
        help="Import torch once per node and fork every rank from that process, instead of each rank importing "
        "torch itself; the script runs exactly as `python -u SCRIPT ARGS` would (see docs/reference.md for the few "
        "differences). Python scripts and modules only."),
    opt("preload", "--preload", env="DDPBOOT_PRELOAD", panel=_PROG, metavar="MODULES",
        help="With --fast-start or --warm: more modules to import once, before forking the ranks (mod1,mod2)."),
    opt("warm", "--warm/--no-warm", env="DDPBOOT_WARM", panel=_PROG,
        help="Fork the ranks from this user's warm process on this node, which imported torch once and is kept "
        "between launches (started by the first warm launch; `ddpboot warm status|stop`). As --fast-start, without "
        "its import on every launch."),
    opt("warm_idle", "--warm-idle", env="DDPBOOT_WARM_IDLE", panel=_PROG, metavar="TIME",
        help="With --warm: the warm process exits after this long without launches (e.g. 15m, 1h)."),
    opt("rdzv_id", "--rdzv-id", "--rdzv_id", env="PET_RDZV_ID", panel=_STORE, metavar="ID",
        help="The job id, given to workers as TORCHELASTIC_RUN_ID and naming the --log-dir subdirectory. Default: a "
        "fresh id per run."),
    opt("rdzv_conf", "--rdzv-conf", "--rdzv_conf", env="PET_RDZV_CONF", panel=_TORCHRUN, metavar="K=V,...",
        help="torchrun's KEY=VALUE,... rendezvous settings: join_timeout (every job with several nodes), "
        "last_call_timeout, close_timeout and the others of torch's c10d rendezvous (elastic jobs)."),
    opt("store", "--store", env="DDPBOOT_STORE", panel=_STORE, choice=StoreBackend,
        help="Who serves the store: `python` (ddpboot's implementation of torch's TCPStore protocol, no torch "
        "import, fastest start) or `torch` (torch's own TCPStore server in the guardian process, for a torch whose "
        "store protocol ddpboot does not know yet)."),
    opt("store_allow", "--store-allow", env="DDPBOOT_STORE_ALLOW", panel=_STORE, metavar="HOSTS",
        help="Serve the store only to these hosts: HOST[,HOST...] as addresses, networks (10.0.0.0/8) or names. "
        "Under SLURM node 0 already serves only the job's nodes; this adds to them. ddpboot's store only: refused "
        "with --store torch and elastic jobs (docs/security.md)."),
    opt("max_restarts", "--max-restarts", "--max_restarts", env="PET_MAX_RESTARTS", panel=_SUP,
        help="Restart every rank up to N times after a failure; TORCHELASTIC_RESTART_COUNT counts the attempts and "
        "each attempt logs to its own attempt_N directory. The exit code is the last attempt's."),
    opt("shutdown_timeout", "--shutdown-timeout", "--shutdown_timeout",
        env=["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], panel=_SUP, metavar="TIME",
        help="How long workers get to exit after SIGTERM before SIGKILL, when a rank fails and when the launcher is "
        f"signalled: seconds, or with a unit (90s, 2m). Default {DEFAULT_SHUTDOWN_TIMEOUT:g}."),
    opt("monitor_interval", "--monitor-interval", "--monitor_interval", env="PET_MONITOR_INTERVAL",
        panel=_TORCHRUN, metavar="SECONDS",
        help="ddpboot sees exits as they happen; this is only how often it re-checks that a stopped rank's leftover "
        "processes are gone."),
    opt("stall_timeout", "--stall-timeout", panel=_SUP, metavar="TIME",
        help="Stop the job when no rank made progress for this long (no output, no rank exited, no rank busy on a "
        "CPU), after dumping every rank's stack into the log and the run directory: seconds, or with a unit (90s, "
        "10m, 2h). Default: never."),
    opt("gpu_watch", "--gpu-watch", panel=_SUP, choice=WatchMode,
        help="While the job runs, check every few seconds which processes use which GPU: warn when a rank (or its "
        "DataLoader worker, or a subprocess) holds memory on a GPU that is not its own, or a process that is not "
        "the job's uses one of its GPUs; strict also ends the job (exit code 125) for the first. Default "
        f"{RunOptions.gpu_watch}."),
    opt("gpu_watch_interval", "--gpu-watch-interval", panel=_SUP, metavar="TIME",
        help="How often --gpu-watch reads the GPUs' processes: seconds, or with a unit. Default "
        f"{RunOptions.gpu_watch_interval}."),
    opt("straggler_window", "--straggler-window", panel=_SUP, metavar="TIME",
        help="Name a rank that is slower than the others of its node (it computes while they wait for it, by their "
        "CPU time) once it has been for this long: seconds, or with a unit; 0 turns it off. Default "
        f"{RunOptions.straggler_window}."),
    opt("signals_to_handle", "--signals-to-handle", "--signals_to_handle", env="PET_SIGNALS_TO_HANDLE",
        panel=_SUP, metavar="SIGNALS",
        help="Signals forwarded to every worker's process group. INT, TERM, HUP and QUIT also stop the job (a second "
        "Ctrl-C kills at once). Not forwarded when the sender (SLURM's slurmstepd) signals the workers itself, nor "
        "twice within 1 s. Others keep their default action."),
    opt("start_method", "--start-method", "--start_method", env="PET_START_METHOD", panel=_TORCHRUN,
        choice=StartMethod,
        help="torchrun's spawn, fork or forkserver: checked, and changes nothing. torchrun too starts a script, "
        "module or program as a fresh process whatever it says (it uses it for --run-path only); every ddpboot "
        "worker is a fresh process (fork+exec), as spawn's are. --fast-start forks ranks from one process that "
        "imported torch."),
    opt("role", "--role", env="PET_ROLE", panel=_TORCHRUN, metavar="NAME",
        help="ROLE_NAME given to the workers, and `${role_name}` in --log-line-prefix-template. As under torchrun, "
        "it names no file."),
    opt("wait_for_gpus", "--wait-for-gpus", env="DDPBOOT_WAIT_FOR_GPUS", panel=_SUP, metavar="TIME",
        help="When the GPUs are busy or held by another ddpboot job, wait up to this long (600, 10m, 2h, inf) "
        "instead of failing."),
    opt("log_dir", "--log-dir", "--log_dir", env="PET_LOG_DIR", panel=_OUT, metavar="DIR",
        help="Write each rank's output to DIR/RUN_ID/attempt_N/rankG.log (both streams, unprefixed) and its @record "
        "traceback to rankG.error.json. Without it nothing is written anywhere."),
    opt("log_mode", "--log-mode", env="DDPBOOT_LOG_MODE", panel=_OUT, choice=LogMode,
        help="Who may read the run's log directory DIR/RUN_ID: `private` (you only: directories 0700, files 0600; "
        "the default) or `shared` (as your umask allows). DIR itself keeps its mode."),
    opt("redirects", "-r", "--redirects", env="PET_REDIRECTS", panel=_TORCHRUN, metavar="STREAMS",
        complete=_STREAMS,
        help="Streams sent to the log files only, not the console: 0 none, 1 stdout, 2 stderr, 3 both; per local "
        "rank as 0:3,10:2. Without --log-dir the files go under $TMPDIR/ddpboot-logs-UID (kept; the launcher names "
        "the run's directory)."),
    opt("tee", "-t", "--tee", env="PET_TEE", panel=_TORCHRUN, metavar="STREAMS", complete=_STREAMS,
        help="Streams written to the log files and shown (same form as --redirects; without --log-dir, files as "
        "there). With --log-dir and neither -r nor -t, both streams of every rank are written and shown."),
    opt("local_ranks_filter", "--local-ranks-filter", "--local_ranks_filter", env="PET_LOCAL_RANKS_FILTER",
        panel=_TORCHRUN, metavar="RANKS",
        help="Show only these local ranks on the console (0,2-3); files still get every rank."),
    opt("ranks_filter", "--ranks-filter", env="DDPBOOT_RANKS_FILTER", panel=_OUT, metavar="RANKS",
        help="Show only these global ranks on the console (0,8-15); files still get every rank."),
    opt("no_prefix", "--no-prefix", env="DDPBOOT_NO_PREFIX", panel=_OUT,
        help="Do not prefix console lines with \\[rankG]:."),
    opt("no_collapse", "--no-collapse", env="DDPBOOT_NO_COLLAPSE", panel=_OUT,
        help="Show every rank's copy of a line that several ranks print alike; by default it is shown once, the ranks "
        "named (\\[rank0-3]: ...). Log files always get every line."),
    opt("log_line_prefix_template", "--log-line-prefix-template", "--log_line_prefix_template",
        env=["PET_LOG_LINE_PREFIX_TEMPLATE", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"], panel=_OUT,
        metavar="TEMPLATE", extra={"show_default": False},
        help="What begins each console line instead of \\[rankG]: , from ${rank}, ${local_rank}, ${node_rank}, "
        "${role_name} (--role) and ${hostname}, e.g. '${hostname}:${rank}: ' (torchrun's, with ${node_rank}); used "
        "as written, spaces included."),
    opt("virtual_local_rank", "--virtual-local-rank", "--virtual_local_rank", env="PET_VIRTUAL_LOCAL_RANK",
        panel=_TORCHRUN, hidden=True,
        help="torchrun's LOCAL_RANK=0 with one GPU per worker: ddpboot's default (--isolation rank)."),
    opt("numa_binding", "--numa-binding", "--numa_binding", panel=_TORCHRUN, metavar="POLICY", choice=NumaBinding,
        extra={"show_default": False},
        help="torchrun's node, socket, exclusive or core-complex, for each rank's own GPU: bind it to the cores of "
        "its GPU's NUMA node, of its socket, an exclusive share of the node's physical cores, or one last-level "
        "cache of the node (docs/reference.md); memory is preferred from the same NUMA nodes. Instead of "
        "--cpu-affinity."),
    opt("no_network_check", "--no-network-check", env="DDPBOOT_NO_NETWORK_CHECK", panel=_STORE,
        help="Several nodes: skip the check, at the nodes' check-in, that every node can reach the address each "
        "node's NCCL or gloo bootstrap would use (docs/clusters.md)."),
    opt("dry_run", "--dry-run", panel=_OUT,
        help="Print the plan and each worker's command and the environment variables ddpboot would set; start "
        "nothing."),
], make=dict)
"""The run command's own options that are RunOptions' fields (launch/config.py), in the order --help shows them
within their panels."""


@dataclass(frozen=True)
class CommandOptions:
    """The run command's options that are no part of a run: --json, and the two that print and exit."""

    as_json: bool = False
    version: bool = False
    print_completion: str | None = None


COMMAND = OptionGroup("command", CommandOptions, [
    opt("as_json", "--json", panel=_OUT,
        help="With --dry-run: print the dry run as one JSON object (the plan, the store, each worker's command and "
        "variables)."),
    opt("version", "--version", panel=_PROG, extra={"is_eager": True, "callback": _print_version},
        help="Print ddpboot's version and exit."),
    opt("print_completion", "--print-completion", panel=_PROG, metavar="SHELL", complete=SHELLS,
        extra={"is_eager": True, "callback": _print_completion, "show_default": False},
        help="Print a completion script for bash, zsh, tcsh or fish and exit, e.g. `eval \"$(ddpboot "
        "--print-completion bash)\"` in ~/.bashrc (as torchrun's)."),
])


@dataclass(frozen=True)
class RefusedOptions:
    """torchrun's options that ddpboot refuses by name (launch/options.py says why and what to use instead), as
    given: declared so that the refusal names them, hidden from --help, listed in docs/guide.md."""

    logs_specs: str | None = None
    event_log_handler: str | None = None
    duplicate_stdout_filters: str | None = None
    duplicate_stderr_filters: str | None = None

    def given(self) -> dict[str, str | None]:
        """Each option as typed (`--logs-specs`) with its value, None where not given."""
        return {f"--{name.replace('_', '-')}": value for name, value in vars(self).items()}


REFUSED = OptionGroup("refused", RefusedOptions, [
    opt(name, f"--{name.replace('_', '-')}", f"--{name}", hidden=True)
    for name in ("logs_specs", "event_log_handler", "duplicate_stdout_filters", "duplicate_stderr_filters")
])
