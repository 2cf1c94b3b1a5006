"""`ddpboot [OPTIONS] SCRIPT [ARGS...]`: run SCRIPT as a DDP job on the planned ranks.

Each option's documentation sits next to it (like torchrun's run.py); `ddpboot --help` shows them grouped. Option
parsing stops at SCRIPT: everything after it is passed to the script untouched (`ddpboot --nproc 2 train.py
--epochs 3` gives the script `--epochs 3`). torchrun's options are accepted under their dash and underscore
spellings, with their PET_* environment defaults, and mean the same thing.

Every check that can fail because of what was asked runs before anything starts: a bad option, a missing script or
module, a port in use, an impossible plan all exit 2 with one message, and no process is left behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from ddpboot.cli import (
    INDEX_RULES,
    Selection,
    build_request,
    handle_errors,
    node_setup,
    option_given,
    plan_for,
    render_plan,
    with_selection,
)
from ddpboot.contract import STOP_SIGNALS, is_tcp_port
from ddpboot.errors import UsageError
from ddpboot.launch.env import EnvContext, worker_argv, worker_vars
from ddpboot.launch.faststart import Zygote, supports
from ddpboot.launch.logs import run_dir
from ddpboot.launch.options import (
    DEFAULT_SIGNALS,
    Std,
    StdSpec,
    check_ranks,
    parse_duration,
    parse_rank_list,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    resolve_std,
)
from ddpboot.launch.preflight import check_target, is_module_name
from ddpboot.launch.spec import LaunchSpec, Routing, Target, TargetKind
from ddpboot.nodes.static import NodeSetup, check_resolvable, cluster_info, parse_endpoint
from ddpboot.selection.locks import GpuLocks
from ddpboot.selection.planner import Plan
from ddpboot.tcpstore.address import bind_store_socket, is_loopback

MULTI_NODE_LATER = (
    "for several nodes give --nnodes N with --node-rank and --master-addr (a fixed node count, or srun under SLURM), "
    "or --nnodes MIN:MAX with --rdzv-backend c10d --rdzv-endpoint HOST:PORT (an elastic job)."
)

_PROG = "Program"
_STORE = "Store and nodes (torchrun's rendezvous options)"
_SUP = "Supervision"
_OUT = "Output"

run_app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    help="Run SCRIPT (with ARGS) as a DDP job: one worker per rank on exactly the planned GPUs, with torchrun's "
    "environment, supervised (fail-fast, signals, no orphans). `ddpboot plan` shows the plan without running; "
    "`ddpboot gpus` lists GPUs.",
)


@run_app.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=INDEX_RULES,
    no_args_is_help=True,
)
@handle_errors
@with_selection
def run(
    selection: Selection,
    script: Annotated[
        str,
        typer.Argument(
            help="The training script (run as `python -u SCRIPT ARGS` with this interpreter, or PYTHON_EXEC), a "
            "module with -m, or a program with --no-python.",
            show_default=False,
            metavar="SCRIPT",
        ),
    ],
    args: Annotated[
        list[str] | None,
        typer.Argument(help="Passed to the script untouched; `${local_rank}` becomes the node-local index.",
                       metavar="ARGS"),
    ] = None,
    module: Annotated[
        bool,
        typer.Option("-m", "--module", envvar="PET_MODULE", rich_help_panel=_PROG,
                     help="SCRIPT is a module name, run as `python -u -m SCRIPT ARGS` from the current directory."),
    ] = False,
    no_python: Annotated[
        bool,
        typer.Option("--no-python", "--no_python", envvar="PET_NO_PYTHON", rich_help_panel=_PROG,
                     help="SCRIPT is a program (a path, or a name on PATH) executed directly, not a Python script."),
    ] = False,
    run_path: Annotated[
        bool,
        typer.Option("--run-path", "--run_path", envvar="PET_RUN_PATH", rich_help_panel=_PROG,
                     help="Run SCRIPT through runpy.run_path as __main__ (torchrun's --run-path); each worker is "
                     "still its own process."),
    ] = False,
    fast_start: Annotated[
        bool,
        typer.Option("--fast-start/--no-fast-start", envvar="DDPBOOT_FAST_START", rich_help_panel=_PROG,
                     help="Import torch once per node and fork every rank from that process, instead of each rank "
                     "importing torch itself; the script runs exactly as `python -u SCRIPT ARGS` would (see "
                     "docs/reference.md for the few differences). Python scripts and modules only."),
    ] = False,
    preload: Annotated[
        str,
        typer.Option("--preload", envvar="DDPBOOT_PRELOAD", rich_help_panel=_PROG,
                     help="With --fast-start: more modules to import once, before forking the ranks (mod1,mod2)."),
    ] = "",
    master_addr: Annotated[
        str | None,
        typer.Option("--master-addr", "--master_addr", envvar="PET_MASTER_ADDR", rich_help_panel=_STORE,
                     help="The store's address, given to workers as MASTER_ADDR. One node: default 127.0.0.1 (the "
                     "store listens on loopback only); another address of this machine makes it listen there."),
    ] = None,
    master_port: Annotated[
        int | None,
        typer.Option("--master-port", "--master_port", envvar="PET_MASTER_PORT", rich_help_panel=_STORE,
                     help="The store's port (MASTER_PORT). Default: a free port that ddpboot binds itself, so no "
                     "other process can take it between choice and use. A port in use is an error."),
    ] = None,
    rdzv_backend: Annotated[
        str,
        typer.Option("--rdzv-backend", "--rdzv_backend", envvar="PET_RDZV_BACKEND", rich_help_panel=_STORE,
                     help="torchrun's rendezvous backend. With --nnodes MIN:MAX: c10d (torch's own rendezvous). "
                     "Otherwise accepted (static or c10d); the workers' store is ddpboot's."),
    ] = "static",
    rdzv_endpoint: Annotated[
        str,
        typer.Option("--rdzv-endpoint", "--rdzv_endpoint", envvar="PET_RDZV_ENDPOINT", rich_help_panel=_STORE,
                     help="HOST:PORT of the rendezvous store. Elastic (--nnodes MIN:MAX): torch's c10d "
                     "rendezvous there, hosted by the launcher on HOST. Fixed node count: stands for --master-addr/"
                     "--master-port. One node: HOST must be this machine; PORT is used like --master-port."),
    ] = "",
    rdzv_id: Annotated[
        str | None,
        typer.Option("--rdzv-id", "--rdzv_id", envvar="PET_RDZV_ID", rich_help_panel=_STORE,
                     help="The job id, given to workers as TORCHELASTIC_RUN_ID and naming the --log-dir "
                     "subdirectory. Default: a fresh id per run."),
    ] = None,
    rdzv_conf: Annotated[
        str,
        typer.Option("--rdzv-conf", "--rdzv_conf", envvar="PET_RDZV_CONF", rich_help_panel=_STORE,
                     help="torchrun's KEY=VALUE,... rendezvous settings: join_timeout (every job with several nodes), "
                     "last_call_timeout, close_timeout and the others of torch's c10d rendezvous (elastic jobs)."),
    ] = "",
    standalone: Annotated[
        bool,
        typer.Option("--standalone", envvar="PET_STANDALONE", rich_help_panel=_STORE,
                     help="torchrun's single-node mode. ddpboot's one-node default already is: a private store on "
                     "loopback (torchrun's listens on every interface)."),
    ] = False,
    local_addr: Annotated[
        str | None,
        typer.Option("--local-addr", "--local_addr", envvar="PET_LOCAL_ADDR", rich_help_panel=_STORE,
                     help="This node's address for other nodes: where node group rank 0 serves the workers' store "
                     "in an elastic job (default: its address on the route to the rendezvous endpoint)."),
    ] = None,
    store: Annotated[
        str,
        typer.Option("--store", envvar="DDPBOOT_STORE", rich_help_panel=_STORE,
                     help="Who serves the store: `python` (ddpboot's implementation of torch's TCPStore protocol, "
                     "no torch import, fastest start) or `torch` (torch's own TCPStore server in the guardian "
                     "process, for a torch whose store protocol ddpboot does not know yet)."),
    ] = "python",
    max_restarts: Annotated[
        int,
        typer.Option("--max-restarts", "--max_restarts", envvar="PET_MAX_RESTARTS", rich_help_panel=_SUP,
                     help="Restart every rank up to N times after a failure; TORCHELASTIC_RESTART_COUNT counts the "
                     "attempts and each attempt logs to its own attempt_N directory. The exit code is the last "
                     "attempt's."),
    ] = 0,
    shutdown_timeout: Annotated[
        float | None,
        typer.Option("--shutdown-timeout", "--shutdown_timeout",
                     envvar=["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], rich_help_panel=_SUP,
                     help="Seconds workers get to exit after SIGTERM before SIGKILL, when a rank fails and when the "
                     "launcher is signalled. Default 30."),
    ] = None,
    monitor_interval: Annotated[
        float,
        typer.Option("--monitor-interval", "--monitor_interval", envvar="PET_MONITOR_INTERVAL",
                     rich_help_panel=_SUP,
                     help="ddpboot sees exits as they happen; this is only how often it re-checks that a stopped "
                     "rank's leftover processes are gone."),
    ] = 0.1,
    signals_to_handle: Annotated[
        str,
        typer.Option("--signals-to-handle", "--signals_to_handle", envvar="PET_SIGNALS_TO_HANDLE",
                     rich_help_panel=_SUP,
                     help="Signals forwarded to every worker's process group. INT, TERM, HUP and QUIT also stop the "
                     "job (a second Ctrl-C kills at once). Not forwarded when the sender (SLURM's slurmstepd) "
                     "signals the workers itself, nor twice within 1 s. Others keep their default action."),
    ] = DEFAULT_SIGNALS,
    start_method: Annotated[
        str,
        typer.Option("--start-method", "--start_method", envvar="PET_START_METHOD", rich_help_panel=_SUP,
                     help="torchrun's spawn, fork or forkserver; accepted. Scripts always start as fresh processes "
                     "(fork+exec), as under torchrun."),
    ] = "spawn",
    role: Annotated[
        str,
        typer.Option("--role", envvar="PET_ROLE", rich_help_panel=_SUP, help="ROLE_NAME given to the workers."),
    ] = "default",
    wait_for_gpus: Annotated[
        str | None,
        typer.Option("--wait-for-gpus", envvar="DDPBOOT_WAIT_FOR_GPUS", rich_help_panel=_SUP,
                     help="When the GPUs are busy or held by another ddpboot job, wait up to this long (600, 10m, 2h, "
                     "inf) instead of failing."),
    ] = None,
    log_dir: Annotated[
        str | None,
        typer.Option("--log-dir", "--log_dir", envvar="PET_LOG_DIR", rich_help_panel=_OUT,
                     help="Write each rank's output to DIR/RUN_ID/attempt_N/rankG.log (both streams, unprefixed) "
                     "and its @record traceback to rankG.error.json. Without it nothing is written anywhere."),
    ] = None,
    redirects: Annotated[
        str | None,
        typer.Option("-r", "--redirects", envvar="PET_REDIRECTS", rich_help_panel=_OUT,
                     help="Streams sent to the log files only, not the console: 0 none, 1 stdout, 2 stderr, 3 both; "
                     "per local rank as 0:3,10:2. Needs --log-dir."),
    ] = None,
    tee: Annotated[
        str | None,
        typer.Option("-t", "--tee", envvar="PET_TEE", rich_help_panel=_OUT,
                     help="Streams written to the log files and shown (same form as --redirects). With --log-dir and "
                     "neither -r nor -t, both streams of every rank are written and shown."),
    ] = None,
    local_ranks_filter: Annotated[
        str | None,
        typer.Option("--local-ranks-filter", "--local_ranks_filter", envvar="PET_LOCAL_RANKS_FILTER",
                     rich_help_panel=_OUT,
                     help="Show only these local ranks on the console (0,2-3); files still get every rank."),
    ] = None,
    ranks_filter: Annotated[
        str | None,
        typer.Option("--ranks-filter", envvar="DDPBOOT_RANKS_FILTER", rich_help_panel=_OUT,
                     help="Show only these global ranks on the console (0,8-15); files still get every rank."),
    ] = None,
    no_prefix: Annotated[
        bool,
        typer.Option("--no-prefix", envvar="DDPBOOT_NO_PREFIX", rich_help_panel=_OUT,
                     help="Do not prefix console lines with [rankG]:."),
    ] = False,
    virtual_local_rank: Annotated[
        bool,
        typer.Option("--virtual-local-rank", "--virtual_local_rank", envvar="PET_VIRTUAL_LOCAL_RANK",
                     rich_help_panel=_OUT, hidden=True,
                     help="torchrun's LOCAL_RANK=0 with one GPU per worker: ddpboot's default (--isolation rank)."),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", rich_help_panel=_OUT,
                     help="Print the plan and each worker's command and the environment variables ddpboot would "
                     "set; start nothing."),
    ] = False,
) -> None:
    """Run SCRIPT as a DDP job on the planned GPUs (see `ddpboot plan`); exit with the failing rank's code."""
    try:
        _run(**locals())
    except KeyboardInterrupt:  # Ctrl-C while planning or waiting for GPUs: nothing was started
        print("ddpboot: interrupted before anything started", file=sys.stderr)
        raise typer.Exit(130) from None


def _run(
    selection: Selection,
    script: str,
    args: list[str] | None,
    module: bool,
    no_python: bool,
    run_path: bool,
    fast_start: bool,
    preload: str,
    master_addr: str | None,
    master_port: int | None,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_id: str | None,
    rdzv_conf: str,
    standalone: bool,
    local_addr: str | None,
    store: str,
    max_restarts: int,
    shutdown_timeout: float | None,
    monitor_interval: float,
    signals_to_handle: str,
    start_method: str,
    role: str,
    wait_for_gpus: str | None,
    log_dir: str | None,
    redirects: str | None,
    tee: str | None,
    local_ranks_filter: str | None,
    ranks_filter: str | None,
    no_prefix: bool,
    virtual_local_rank: bool,
    dry_run: bool,
) -> None:
    env = dict(os.environ)
    cwd = Path.cwd()

    # --- the launcher's own options: cheap checks first, nothing touched yet --------------------------------
    kind: TargetKind = "script"
    if module and no_python:
        raise UsageError("-m/--module and --no-python contradict each other: a module needs Python. Choose one.")
    if run_path and module:
        raise UsageError("--run-path runs a script file; with -m give the module without --run-path.")
    if run_path:
        kind = "run_path"  # takes precedence over --no-python, as in torchrun
    elif module:
        kind = "module"
    elif no_python:
        kind = "binary"
    if virtual_local_rank and selection.isolation.strip().lower() == "node":
        raise UsageError("--virtual-local-rank (LOCAL_RANK=0, one GPU per worker) contradicts --isolation node.")
    backend = store.strip().lower()
    if backend not in ("python", "torch"):
        raise UsageError(f"--store {store!r}: choose python (ddpboot's store, the default) or torch.")
    signals = parse_signals(signals_to_handle)
    if not dry_run:
        block_early(signals)
    shutdown = parse_duration(30.0 if shutdown_timeout is None else shutdown_timeout, "--shutdown-timeout")
    monitor = parse_duration(monitor_interval, "--monitor-interval", allow_zero=False)
    if max_restarts < 0:
        raise UsageError(f"--max-restarts {max_restarts}: give 0 (no restart) or more.")
    if start_method not in ("spawn", "fork", "forkserver"):
        raise UsageError(f"--start-method {start_method!r}: torchrun's choices are spawn, fork and forkserver.")
    parse_rdzv_conf(rdzv_conf)
    if rdzv_backend.strip().lower() not in ("static", "c10d", "etcd", "etcd-v2"):
        raise UsageError(f"--rdzv-backend {rdzv_backend!r}: torchrun's backends are static, c10d, etcd and etcd-v2.")
    nodes = _nodes(selection, env, master_addr, master_port, rdzv_endpoint, standalone, max_restarts)
    selection = replace(selection, nnodes=str(nodes.nnodes), node_rank=nodes.node_rank)
    multi = nodes.nnodes > 1
    if multi:
        bind_addr, port = nodes.master_addr, nodes.master_port
        master_addr = nodes.master_addr
    else:
        bind_addr, port = _store_address(master_addr, master_port, rdzv_endpoint, standalone)
    join_timeout = _join_timeout(parse_rdzv_conf(rdzv_conf))
    red = parse_std(redirects, "--redirects") if redirects is not None else None
    teed = parse_std(tee, "--tee") if tee is not None else None
    writes = [s for s in (red, teed) if s is not None and s != Std.NONE]
    if writes and not log_dir:
        raise UsageError(
            "-r/--redirects and -t/--tee write worker output to files, which needs --log-dir DIR (torchrun would "
            "use a temporary directory and leave it behind)."
        )
    local_filter = parse_rank_list(local_ranks_filter, "--local-ranks-filter") if local_ranks_filter else None
    global_filter = parse_rank_list(ranks_filter, "--ranks-filter") if ranks_filter else None
    python = env.get("PYTHON_EXEC") or sys.executable
    target = check_target(Target(kind, script, tuple(args or ())), python, env, cwd)
    preloads = _preloads(preload, fast_start)
    if fast_start and not supports(target):
        print(f"ddpboot: note: --fast-start forks Python ranks; {script} is a program (--no-python), so every rank "
              "starts with exec as usual", file=sys.stderr, flush=True)
        fast_start = False

    # --- the plan (and, for a real run, the GPU locks) ------------------------------------------------------
    locks = None
    if dry_run:
        plan = plan_for(selection, env, nodes=nodes)
    else:
        plan, locks = _reserve(selection, env, wait_for_gpus)
        plan = replace(plan, cluster=cluster_info(nodes), notes=plan.notes + nodes.notes)
        for note in nodes.notes:
            print(f"ddpboot: note: {note}", file=sys.stderr, flush=True)
    nlocal = len(plan.ranks)
    if local_filter is not None:
        check_ranks(local_filter, nlocal, "--local-ranks-filter", "local rank")
    if global_filter is not None:
        check_ranks(global_filter, plan.world_size, "--ranks-filter", "rank")
    routing = _routing(plan, red, teed, bool(log_dir), local_filter, global_filter, not no_prefix)

    run_id = rdzv_id if rdzv_id and rdzv_id != "none" else _new_run_id(nodes, env)
    spec = LaunchSpec(
        target=target,
        python=python,
        run_id=run_id,
        role=role,
        max_restarts=max_restarts,
        shutdown_timeout=shutdown,
        monitor_interval=monitor,
        routing=routing,
        signals=signals,
        master_addr=master_addr if master_addr and not is_loopback(master_addr) else "127.0.0.1",
        bind_addr=bind_addr,
        master_port=port,
        store=backend,  # type: ignore[arg-type]
    )

    if dry_run:
        if fast_start:
            print(f"fast start: one process imports torch{' and ' + ', '.join(preloads) if preloads else ''} with "
                  f"{python}, then forks every rank")
        if port and nodes.node_rank == 0:
            _bind(nodes, bind_addr, port).close()  # a port in use is reported now, not at launch
        _print_dry_run(plan, spec, env)
        return

    if nodes.source == "elastic":  # --nnodes MIN:MAX: rounds of torch's c10d rendezvous, one Supervisor each
        from ddpboot.launch.elastic import run_elastic

        with _fast_start(fast_start, python, target, cwd, env, plan, preloads) as zygote:
            code = run_elastic(spec, plan, env, nodes, locks=locks, rdzv_id=rdzv_id, rdzv_backend=rdzv_backend,
                               rdzv_conf=parse_rdzv_conf(rdzv_conf), max_restarts=max_restarts, log_dir=log_dir,
                               supervisor_kwargs={"zygote": zygote})
        raise typer.Exit(code)

    # Node 0 (or a one-node job) serves the store; on other nodes the guardian's store socket is a private loopback
    # one that nobody uses, and the workers connect to node 0's.
    _stop_if_signalled()
    listener = _bind(nodes, bind_addr, port) if nodes.node_rank == 0 else bind_store_socket("127.0.0.1", None)
    try:
        if log_dir:
            workdir, temporary = run_dir(Path(log_dir), run_id), False
            print(f"ddpboot: logs in {workdir}", file=sys.stderr, flush=True)
        else:
            workdir, temporary = Path(tempfile.mkdtemp(prefix="ddpboot-")), True
    except BaseException:
        listener.close()
        raise
    from ddpboot.launch.supervisor import Supervisor

    before_start = None
    if multi:
        from ddpboot.nodes.check import check_nodes

        assert nodes.master_port is not None

        def before_start() -> None:
            check_nodes(nodes.master_addr, nodes.master_port or 0, nodes.nnodes, nodes.node_rank, len(plan.ranks),
                        timeout=join_timeout,
                        progress=lambda msg: print(f"ddpboot: {msg}", file=sys.stderr, flush=True))

    try:
        with _fast_start(fast_start, python, target, cwd, env, plan, preloads) as zygote:
            sup = Supervisor(replace(spec, log_dir=None if temporary else workdir), plan, listener, env, workdir,
                             temporary, before_start=before_start, zygote=zygote)
            code = sup.run()
    finally:
        if locks is not None:
            locks.release()
    raise typer.Exit(code)


# --- helpers ----------------------------------------------------------------------------------------


def _nodes(
    sel: Selection,
    env: dict[str, str],
    master_addr: str | None,
    master_port: int | None,
    endpoint: str,
    standalone: bool,
    max_restarts: int,
) -> NodeSetup:
    """Node count, node rank and store address: flags > SLURM step (one ddpboot per node) > one node
    (nodes/static.py). For several nodes, `--rdzv-endpoint HOST:PORT` stands for --master-addr/--master-port as in
    torchrun, and the master address must resolve now: a name that does not would make every worker hang. An elastic
    range (MIN:MAX) goes to torch's c10d rendezvous (launch/elastic.py), which decides the node rank at each round."""
    from ddpboot.nodes.static import parse_node_range

    low, high = parse_node_range(sel.nnodes)
    if low != high:
        from ddpboot.nodes.elastic import elastic_nodes

        ignored = tuple(f"--{o.replace('_', '-')}" for o in ("node_rank", "master_addr", "master_port")
                        if option_given(o))
        return elastic_nodes(sel.nnodes.strip(), low, high, endpoint, standalone=standalone,
                             rdzv_backend=str(_cli_value("rdzv_backend", "c10d")),
                             ranks_filter=_cli_value("ranks_filter"), local_addr=_cli_value("local_addr"),
                             ignored_options=ignored)
    if standalone:
        _one_node(sel, standalone)
        return node_setup(replace(sel, nnodes="1", node_rank=0), {})
    nodes = node_setup(sel, env, master_addr, master_port)
    if nodes.nnodes > 1 and endpoint and (master_addr is None or master_port is None):
        host, ep_port = parse_endpoint(endpoint)
        nodes = node_setup(sel, env, master_addr or host or None, master_port or ep_port)
    if nodes.nnodes == 1:
        return nodes
    if max_restarts:
        raise UsageError(
            f"--max-restarts {max_restarts} with {nodes.nnodes} nodes: restarting needs every node to agree on a new "
            "round, which static multi-node jobs do not have yet. Drop --max-restarts (under SLURM, requeue the job: "
            "scripts/slurm/requeue.sbatch), or restart on one node."
        )
    check_resolvable(nodes.master_addr, timeout=5.0)
    return nodes


def _cli_value(name: str, default: Any = None) -> Any:
    """The value of the running command's option `name` (parsed already), or `default` outside a command."""
    try:  # typer ≥ 0.22 vendors click as typer._click; older ones depend on click itself
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - depends on the typer version
        from click import get_current_context  # type: ignore[no-redef, import-not-found, unused-ignore]

    ctx: Any = get_current_context(silent=True)
    if ctx is None:
        return default
    return ctx.params.get(name, default)


def _preloads(text: str, fast_start: bool) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names and not fast_start:
        raise UsageError(f"--preload {text}: modules are preloaded only with --fast-start; add --fast-start or drop "
                         "--preload.")
    bad = [m for m in names if not is_module_name(m)]
    if bad:
        raise UsageError(f"--preload {text}: {', '.join(map(repr, bad))} is not a module name (dotted identifiers, "
                         "comma-separated: --preload numpy,transformers).")
    return names


@contextlib.contextmanager
def _fast_start(wanted: bool, python: str, target: Target, cwd: Path, env: dict[str, str], plan: Plan,
                preloads: list[str]) -> Iterator[Zygote | None]:
    """With --fast-start, the fast-start process (importing while the launcher finishes starting), let go at the
    end; else None. It imports torch with the ranks' OMP_NUM_THREADS when they share one value (libgomp and
    OpenBLAS read it once, at import)."""
    if not wanted:
        yield None
        return
    zenv = dict(env)
    threads = {env.get("OMP_NUM_THREADS") or str(max(s.omp_threads, 1)) for s in plan.ranks}
    if len(threads) == 1:
        zenv["OMP_NUM_THREADS"] = threads.pop()
    zygote = Zygote.start(python, target, cwd, zenv, preloads)
    try:
        yield zygote
    finally:
        zygote.close()


def _bind(nodes: NodeSetup, addr: str, port: int | None) -> socket.socket:
    """Node 0's store socket, on the master address only (not every interface, unlike torchrun's)."""
    try:
        return bind_store_socket(addr, port)
    except UsageError as exc:
        if nodes.nnodes == 1 or "not an address of this machine" not in str(exc):
            raise
        raise UsageError(
            f"--master-addr {addr} is not an address of this machine, and this is node 0 (--node-rank 0), which "
            "serves the job's store on the master address. Run node rank 0 on the machine that has that address, "
            "or give an address of this machine as --master-addr on every node."
        ) from None


def _join_timeout(conf: dict[str, str]) -> float:
    """How long nodes wait for each other before starting workers (torchrun's --rdzv-conf join_timeout)."""
    from ddpboot.nodes.check import DEFAULT_JOIN_TIMEOUT

    text = conf.get("join_timeout")
    if text is None:
        return DEFAULT_JOIN_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"--rdzv-conf join_timeout={text}: give a number of seconds above 0 (default 600).")
    return value


def _one_node(sel: Selection, standalone: bool) -> Selection:
    """A one-node job (`--standalone`); torchrun writes a fixed node count as `1:1`. Several nodes exit 2."""
    text = sel.nnodes.strip()
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo != hi:
            raise UsageError(f"--nnodes {text} is an elastic range, and --standalone a one-node job; drop one of them.")
        text = str(lo)
        sel = replace(sel, nnodes=text)
    if text.isdigit() and int(text) > 1:
        raise UsageError(f"--nnodes {text} with --standalone, a one-node job: drop --standalone; {MULTI_NODE_LATER}")
    if standalone and text.isdigit() and int(text) != 1:
        raise UsageError("--standalone is a one-node job; drop --nnodes or --standalone.")
    from ddpboot.cluster.slurm import in_srun_step, slurm_node_info

    if in_srun_step(os.environ):
        # Inside `srun -N2 ddpboot ...` each node's launcher would otherwise run a world of its own.
        nodes = slurm_node_info(os.environ).nnodes
        if nodes > 1:
            raise UsageError(f"this srun step spans {nodes} nodes: {MULTI_NODE_LATER}")
    return sel


def _store_address(
    master_addr: str | None, master_port: int | None, endpoint: str, standalone: bool
) -> tuple[str, int | None]:
    """Where the one-node store listens: loopback unless --master-addr names another address of this machine."""
    addr = master_addr or "127.0.0.1"
    port = master_port
    if port is not None and not is_tcp_port(port):
        raise UsageError(f"--master-port {port} is not a TCP port (1-65535).")
    if endpoint and not standalone:
        host, ep_port = parse_endpoint(endpoint)
        import socket

        if host and not is_loopback(host) and host not in (socket.gethostname(), socket.getfqdn()):
            raise UsageError(
                f"--rdzv-endpoint {endpoint}: {host} is another host, and a one-node job serves its store here. "
                f"Drop --rdzv-endpoint (or give localhost:PORT); {MULTI_NODE_LATER}"
            )
        if ep_port and port is None:
            port = ep_port
    return ("127.0.0.1" if is_loopback(addr) else addr), (port or None)


def _routing(
    plan: Plan,
    red: StdSpec | None,
    teed: StdSpec | None,
    have_dir: bool,
    local_filter: frozenset[int] | None,
    global_filter: frozenset[int] | None,
    prefix: bool,
) -> Routing:
    """torchrun's rules: redirected streams go to files only, teed ones to files and console. With --log-dir and
    neither option, everything goes to both (torchrun would write nothing)."""
    n = len(plan.ranks)
    r = resolve_std(red, n, "--redirects") if red is not None else dict.fromkeys(range(n), Std.NONE)
    t = resolve_std(teed, n, "--tee") if teed is not None else dict.fromkeys(range(n), Std.NONE)
    files: dict[int, Std] = {}
    console: dict[int, Std] = {}
    for slot in plan.ranks:
        lr = slot.local_rank
        if have_dir and red is None and teed is None:
            files[lr] = Std.ALL
        else:
            files[lr] = (r[lr] | t[lr]) if have_dir else Std.NONE
        shown = Std.ALL & ~(r[lr] & ~t[lr])
        if (local_filter is not None and lr not in local_filter) or (
            global_filter is not None and slot.rank not in global_filter
        ):
            shown = Std.NONE
        console[lr] = Std(shown)
    return Routing(files=files, console=console, prefix=prefix)


def _reserve(sel: Selection, env: dict[str, str], wait_for_gpus: str | None) -> tuple[Plan, GpuLocks | None]:
    from ddpboot.selection.inventory import load_inventory
    from ddpboot.selection.locks import lock_dir
    from ddpboot.selection.planner import make_plan
    from ddpboot.selection.reserve import parse_wait, reserve

    wait = parse_wait(wait_for_gpus)
    req = build_request(sel)
    cpus = sorted(os.sched_getaffinity(0))
    return reserve(
        lambda: load_inventory(env),
        lambda inventory, locked: make_plan(req, inventory, env, allowed_cpus=cpus, locked=locked),
        lock_dir(env),
        wait=wait,
        progress=lambda msg: print(f"ddpboot: {msg}", file=sys.stderr, flush=True),
        share=sel.share,
        sleep=_sleep_unless_stopped,
    )


def block_early(signals: tuple[signal.Signals, ...]) -> None:
    """Block the handled signals and SIGCHLD now, before planning, for every thread to come.

    Why here: NVML (libnvidia-ml) leaves a thread of its own in the launcher even after nvmlShutdown (seen on
    2×H200: a thread named `cuda00001800007`), and a thread inherits its creator's signal mask. A process-directed
    signal goes to any thread that does not block it: a SIGCHLD taken by NVML's thread is discarded (the
    supervisor would never learn that a worker exited) and a SIGTERM kills the launcher with its default action.
    Blocked everywhere, they wait for the supervisor's signalfd. Until then, a stop signal is seen by
    `_sleep_unless_stopped` while waiting for GPUs; planning otherwise takes well under a second."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {*signals, signal.SIGCHLD})


def _stop_if_signalled() -> None:
    """A stop signal that arrived while planning (blocked since block_early) ends the run before anything starts."""
    stops = STOP_SIGNALS & signal.sigpending()
    if stops:
        info = signal.sigtimedwait(stops, 0)
        if info is not None:
            print(f"ddpboot: {signal.Signals(info.si_signo).name} before the start: nothing was started",
                  file=sys.stderr)
            raise typer.Exit(128 + info.si_signo)


def _sleep_unless_stopped(seconds: float) -> None:
    stops = STOP_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if not stops:
        time.sleep(seconds)
        return
    info = signal.sigtimedwait(stops, seconds)
    if info is not None:
        print(f"ddpboot: {signal.Signals(info.si_signo).name} while waiting for GPUs: nothing was started",
              file=sys.stderr)
        raise typer.Exit(128 + info.si_signo)


def _new_run_id(nodes: NodeSetup | None = None, env: dict[str, str] | None = None) -> str:
    """A fresh id for one node. On several nodes every launcher must give its workers the same
    TORCHELASTIC_RUN_ID without talking first: the SLURM job and step ids, else the store's address."""
    if nodes is not None and nodes.source == "elastic" and nodes.rdzv_endpoint:
        from ddpboot.nodes.elastic import default_run_id

        return default_run_id(nodes.rdzv_endpoint)
    if nodes is not None and nodes.nnodes > 1:
        env = env or {}
        job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
        if nodes.source == "slurm" and job and step:
            return f"slurm-{job}.{step}"
        return f"nodes-{nodes.master_addr}-{nodes.master_port}"
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


def _print_dry_run(plan: Plan, spec: LaunchSpec, env: dict[str, str]) -> None:
    render_plan(plan)
    port = spec.master_port or 0
    ctx = EnvContext(spec.master_addr, port, spec.run_id, spec.role, 0, spec.max_restarts,
                     ",".join(s.name for s in spec.signals))
    print()
    print(f"store: {spec.store} server on {spec.bind_addr}:" + (str(port) if port else "<a free port bound at launch>"))
    for slot in plan.ranks:
        argv = worker_argv(spec.target, spec.python, slot.local_rank)
        own = worker_vars(plan, slot, ctx, env, f"<log dir>/attempt_0/rank{slot.rank}.error.json")
        if not port:
            own["MASTER_PORT"] = "<port bound at launch>"
        print(f"\nrank {slot.rank} (local rank {slot.local_rank}): {shlex.join(argv)}")
        if slot.cpus:
            from ddpboot.selection.affinity import format_cpu_list

            print(f"  cpu affinity: {format_cpu_list(slot.cpus)}")
        for key, value in own.items():
            was = f"  (was {env[key]!r})" if key in env and env[key] != value else ""
            print(f"  {key}={shlex.quote(value)}{was}")
