"""The `ddpboot` command line: `ddpboot [OPTIONS] SCRIPT [ARGS...]` runs a job; `plan`, `gpus`, `smoke` are tools.

Errors a user can cause (DdpbootError) are printed as one paragraph without a traceback and exit 2; nothing has
been started then. Planning reads NVML only: this module never imports torch.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from ddpboot.errors import DdpbootError, UsageError
from ddpboot.nodes.static import NodeSetup, cluster_info, parse_nnodes, resolve_nodes
from ddpboot.selection.affinity import format_cpu_list
from ddpboot.selection.inventory import GPU, Inventory, load_inventory
from ddpboot.selection.locks import current_holders, lock_dir
from ddpboot.selection.planner import DEFAULT_MAX_UTIL, Plan, Request, busy_reasons, make_plan, resolve_list
from ddpboot.selection.request import parse_request
from ddpboot.selection.visible import resolve_visible
from ddpboot.units import format_size, parse_size

TOOLS = ("plan", "gpus", "smoke")

INDEX_RULES = """\
GPU numbering: indices given to --gpus and --exclude are physical indices, the ones nvidia-smi and
`ddpboot gpus` show, whatever CUDA_VISIBLE_DEVICES says. When the launcher inherits a CUDA_VISIBLE_DEVICES
(e.g. from SLURM), they must still name GPUs it allows: with CUDA_VISIBLE_DEVICES=2,3, `--gpus 3` means
physical GPU 3 and `--gpus 0` is an error. UUIDs (or unique prefixes: GPU-5f1c), PCI bus ids (0000:18:00.0),
ranges (0-3) and MIG instances (3:1) are accepted too. Each worker then sees only its own GPUs, as cuda:0.
"""

F = TypeVar("F", bound=Callable[..., Any])


# --- output ----------------------------------------------------------------------------------------


def escape(text: str) -> str:
    """Text shown through rich markup: square brackets in messages (paths, tracebacks) are not tags."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (logs, CI) gets whole tables rather than rich's 80-column guess.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def fail(message: str, code: int = 2) -> NoReturn:
    _console(stderr=True).print(f"[bold red]ddpboot: error:[/] {escape(message)}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn a DdpbootError into its message and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DdpbootError as exc:
            fail(str(exc), exc.exit_code)

    return wrapper  # type: ignore[return-value]


# --- the selection options shared by a job, `plan` and `smoke` ------------------------------------------


@dataclass(frozen=True)
class Selection:
    nproc: str | None
    gpus: str | None
    exclude: str | None
    gpus_per_proc: int
    isolation: str
    cpu: bool
    max_used_memory: str
    max_util: int
    nnodes: str
    node_rank: int
    cpu_affinity: str
    share: bool


_SEL = "Selection"
SELECTION_PARAMS = [
    inspect.Parameter(
        "nproc",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                "--nproc",
                "--nproc-per-node",
                "--nproc_per_node",
                envvar="PET_NPROC_PER_NODE",
                help="Processes (ranks) on this node: a number, `gpu` (every allowed GPU), `auto` (every free GPU, "
                "or one per CPU core without GPUs) or `cpu` (one CPU rank per core). Default: 1, or as many as "
                "--gpus names.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "gpus",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                "--gpus",
                envvar="DDPBOOT_GPUS",
                help="Use exactly these GPUs, in this order (rank 0 gets the first): physical indices, ranges, "
                "UUIDs or prefixes, PCI bus ids, MIG instances (3:1). Busy GPUs are used if named here.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "exclude",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option(
                "--exclude",
                envvar="DDPBOOT_EXCLUDE",
                help="Never use these GPUs (same forms as --gpus).",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "gpus_per_proc",
        inspect.Parameter.KEYWORD_ONLY,
        default=1,
        annotation=Annotated[
            int,
            typer.Option(
                "--gpus-per-proc",
                help="GPUs per rank; a rank's CUDA_VISIBLE_DEVICES lists them all and its first is cuda:0.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "isolation",
        inspect.Parameter.KEYWORD_ONLY,
        default="rank",
        annotation=Annotated[
            str,
            typer.Option(
                "--isolation",
                envvar="DDPBOOT_ISOLATION_MODE",
                help="`rank`: each worker sees only its own GPUs (as cuda:0) and LOCAL_RANK is 0, the true index "
                "is DDPBOOT_LOCAL_RANK. `node`: every worker sees all selected GPUs and the true LOCAL_RANK "
                "(torchrun's semantics).",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "cpu",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option("--cpu", help="Run CPU ranks (gloo) even where GPUs exist.", rich_help_panel=_SEL),
        ],
    ),
    inspect.Parameter(
        "max_used_memory",
        inspect.Parameter.KEYWORD_ONLY,
        default="256MiB",
        annotation=Annotated[
            str,
            typer.Option(
                "--max-used-memory",
                help="A GPU with more memory in use than this counts as busy for automatic selection.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "max_util",
        inspect.Parameter.KEYWORD_ONLY,
        default=DEFAULT_MAX_UTIL,
        annotation=Annotated[
            int,
            typer.Option(
                "--max-util",
                help="A GPU busier than this utilization (percent) counts as busy for automatic selection.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "nnodes",
        inspect.Parameter.KEYWORD_ONLY,
        default="1",
        annotation=Annotated[
            str,
            typer.Option("--nnodes", envvar="PET_NNODES", rich_help_panel=_SEL,
                         help="Number of nodes: N (static), or MIN:MAX for an elastic job through torch's c10d "
                         "rendezvous (needs --rdzv-backend c10d and --rdzv-endpoint HOST:PORT)."),
        ],
    ),
    inspect.Parameter(
        "node_rank",
        inspect.Parameter.KEYWORD_ONLY,
        default=0,
        annotation=Annotated[
            int,
            typer.Option(
                "--node-rank", "--node_rank", envvar="PET_NODE_RANK", help="This node's index.", rich_help_panel=_SEL
            ),
        ],
    ),
    inspect.Parameter(
        "cpu_affinity",
        inspect.Parameter.KEYWORD_ONLY,
        default="auto",
        annotation=Annotated[
            str,
            typer.Option(
                "--cpu-affinity",
                envvar="DDPBOOT_CPU_AFFINITY",
                help="`auto`: bind each rank to the cores near its GPU (NVML), split fairly among ranks sharing "
                "them, within the cores ddpboot may use; `none`: no binding; a list (0-15) split among the ranks, "
                "or one list per rank separated by ';' (0-7;8-15). Unless OMP_NUM_THREADS is set, each rank gets "
                "its share of cores as OMP_NUM_THREADS.",
                rich_help_panel=_SEL,
            ),
        ],
    ),
    inspect.Parameter(
        "share",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                "--share",
                help="Use GPUs named in --gpus even if another ddpboot job holds them (their locks are not taken).",
                rich_help_panel=_SEL,
            ),
        ],
    ),
]
_SELECTION_NAMES = [p.name for p in SELECTION_PARAMS]


def with_selection(fn: F) -> F:
    """Add the selection options to a command; the command receives them as one `selection: Selection`."""
    sig = inspect.signature(fn, eval_str=True)  # an explicit __signature__ is never evaluated later
    own = [p for p in sig.parameters.values() if p.name != "selection"]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sel = Selection(**{name: kwargs.pop(name) for name in _SELECTION_NAMES})
        return fn(*args, selection=sel, **kwargs)

    params = own + SELECTION_PARAMS
    params.sort(key=lambda p: p.kind)  # positional arguments first
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]


def build_request(sel: Selection) -> Request:
    if ":" in sel.nnodes:
        raise UsageError(
            f"--nnodes {sel.nnodes}: elastic node ranges (MIN:MAX) are not supported yet; give a fixed node count."
        )
    try:
        nnodes = int(sel.nnodes)
    except ValueError:
        raise UsageError(f"--nnodes {sel.nnodes!r} is not a number of nodes.") from None
    if not 0 <= sel.max_util <= 100:
        raise UsageError(f"--max-util {sel.max_util}: give a percentage between 0 and 100.")
    return parse_request(
        nproc=sel.nproc,
        gpus=sel.gpus,
        exclude=sel.exclude,
        gpus_per_proc=sel.gpus_per_proc,
        isolation=sel.isolation.strip().lower(),
        cpu=sel.cpu,
        max_used_memory=parse_size(sel.max_used_memory, "--max-used-memory"),
        max_util=sel.max_util,
        nnodes=nnodes,
        node_rank=sel.node_rank,
        cpu_affinity=sel.cpu_affinity,
        share=sel.share,
    )


def option_given(name: str) -> bool:
    """Whether the running command's option `name` came from the command line or its environment variable (not its
    default): an explicit `--node-rank 0` overrides SLURM's node rank, the default 0 does not."""
    try:  # typer ≥ 0.22 vendors click as typer._click; older ones depend on click itself
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - depends on the typer version
        from click import get_current_context  # type: ignore[no-redef, import-not-found, unused-ignore]

    ctx: Any = get_current_context(silent=True)
    if ctx is None:
        return True
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def node_setup(
    sel: Selection, env: Mapping[str, str], master_addr: str | None = None, master_port: int | None = None
) -> NodeSetup:
    """Node count, node rank and store address: flags (given ones only) > SLURM step > one node."""
    nnodes = parse_nnodes(sel.nnodes) if option_given("nnodes") else None
    node_rank = sel.node_rank if option_given("node_rank") else None
    return resolve_nodes(env, nnodes, node_rank, master_addr, master_port)


def plan_for(
    sel: Selection,
    env: Mapping[str, str] | None = None,
    nodes: NodeSetup | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Plan:
    """The plan this node would run now, from options and the environment (inventory, CUDA_VISIBLE_DEVICES,
    GPUs other ddpboot jobs hold, SLURM's node list). The launcher plans through `ddpboot.selection.reserve`, which also
    takes the locks."""
    env = os.environ if env is None else env
    nodes = nodes or node_setup(sel, env, master_addr, master_port)
    req = build_request(replace(sel, nnodes=str(nodes.nnodes), node_rank=nodes.node_rank))
    inventory = load_inventory(env)
    held = current_holders([u.uuid for u in inventory.units()], lock_dir(env))
    plan = make_plan(
        req,
        inventory,
        env,
        allowed_cpus=sorted(os.sched_getaffinity(0)),
        locked={u: h.describe() for u, h in held.items()},
    )
    return replace(plan, cluster=cluster_info(nodes), notes=plan.notes + nodes.notes)


# --- rendering -------------------------------------------------------------------------------------


def _short(uuid: str) -> str:
    return uuid[:12] + "…" if len(uuid) > 12 else uuid


def render_plan(plan: Plan) -> None:
    from rich.table import Table

    con = _console()
    nodes = f"{plan.nnodes} node{'s' if plan.nnodes > 1 else ''}"
    head = (
        f"[bold]world size {plan.world_size}[/] · {nodes} (this is node {plan.node_rank}) · "
        f"isolation [bold]{plan.isolation}[/] · backend {plan.backend} · inventory {plan.inventory_source} · "
        f"visible: {plan.visible}"
    )
    if plan.cluster.get("description"):
        head += f" · nodes from {escape(str(plan.cluster['description']))}"
    con.print(head)
    table = Table(show_edge=False, header_style="bold")
    cols = ("rank", "local", "GPU", "UUID", "PCI bus id", "name", "free", "CUDA_VISIBLE_DEVICES", "device", "cores")
    for col in cols:
        table.add_column(col, no_wrap=col in ("UUID", "PCI bus id", "CUDA_VISIBLE_DEVICES"))
    for slot in plan.ranks:
        cores = format_cpu_list(slot.cpus) or "any"
        if not slot.gpus:
            table.add_row(str(slot.rank), str(slot.local_rank), "-", "-", "-", "CPU", "-", '""', "cpu", cores)
            continue
        cvd = ",".join(_short(u) for u in slot.cuda_visible_devices.split(","))
        if plan.isolation == "node" and len(plan.ranks) > 1:
            cvd = f"all {len(slot.cuda_visible_devices.split(','))} selected"
        for j, gpu in enumerate(slot.gpus):
            first = j == 0
            device = slot.device if first else f"cuda:{int(slot.device.split(':')[1]) + j}"
            table.add_row(
                str(slot.rank) if first else "",
                str(slot.local_rank) if first else "",
                gpu.label,
                _short(gpu.uuid),
                gpu.pci_bus_id,
                gpu.name,
                format_size(gpu.memory_free),
                cvd if first else "",
                f"{device} = GPU {gpu.label}",
                cores if first else "",
            )
    con.print(table)
    for note in plan.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def gpu_states(inventory: Inventory, req: Request, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """One record per GPU (and MIG instance) with the derived states `ddpboot gpus` shows."""
    visible = resolve_visible(inventory, env)
    excluded = {u.uuid for u in resolve_list(req.exclude, inventory, "--exclude")} if req.exclude else set()
    holders = current_holders([u.uuid for u in inventory.units()], lock_dir(env))
    out = []

    def record(unit: GPU) -> dict[str, Any]:
        reasons = busy_reasons(unit, req)
        holder = holders.get(unit.uuid)
        rec = unit.to_json()
        rec.update(
            utilization=unit.utilization,
            processes=list(unit.processes),
            cpu_affinity=list(unit.cpu_affinity),
            numa_node=unit.numa_node,
            visible=visible.allows(unit) if not unit.mig_enabled else any(visible.allows(m) for m in unit.mig_devices),
            busy=bool(reasons),
            busy_reasons=reasons,
            excluded=unit.uuid in excluded,
            locked=holder is not None,
            locked_by=holder.__dict__ if holder else None,
        )
        return rec

    for gpu in inventory.gpus:
        rec = record(gpu)
        if gpu.mig_enabled:
            rec["mig_devices"] = [record(m) for m in gpu.mig_devices]
        out.append(rec)
    return out


def render_gpus(records: list[dict[str, Any]], inventory: Inventory) -> None:
    from rich.table import Table

    con = _console()
    if not records:
        con.print("No GPUs" + (": " + "; ".join(inventory.notes) if inventory.notes else "."), soft_wrap=True)
        return
    table = Table(show_edge=False, header_style="bold")
    for col in ("GPU", "UUID", "PCI bus id", "name", "memory used", "util", "procs", "state"):
        table.add_column(col, no_wrap=True)

    def row(rec: dict[str, Any], label: str) -> None:
        if rec["locked"]:
            h = rec["locked_by"]
            state = f"[magenta]locked[/] by {h['user']} (pid {h['pid']}: {h['command']})"
        elif not rec["visible"]:
            state = "[dim]not visible[/]"
        elif rec["excluded"]:
            state = "[dim]excluded[/]"
        elif rec["busy"]:
            state = "[red]busy[/] (" + "; ".join(rec["busy_reasons"]) + ")"
        else:
            state = "[green]free[/]"
        if rec.get("mig_devices"):
            state = "MIG mode"
        util = "?" if rec["utilization"] is None else f"{rec['utilization']}%"
        used = f"{format_size(rec['memory_used'])} / {format_size(rec['memory_total'])}"
        table.add_row(
            label, _short(rec["uuid"]), rec["pci_bus_id"], rec["name"], used, util, str(len(rec["processes"])), state
        )

    for rec in records:
        row(rec, str(rec["index"]))
        for mig in rec.get("mig_devices", []):
            row(mig, f"  {mig['index']}:{mig['mig_index']}")
    con.print(table)
    for note in inventory.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


# --- commands --------------------------------------------------------------------------------------

tools = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ddpboot's tools. Run a job with `ddpboot [OPTIONS] SCRIPT [ARGS...]` (see `ddpboot --help`).",
    rich_markup_mode=None,
)


@tools.command("plan", epilog=INDEX_RULES)
@handle_errors
@with_selection
def plan_cmd(
    selection: Selection,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
    master_addr: Annotated[
        str | None,
        typer.Option("--master-addr", "--master_addr", envvar="PET_MASTER_ADDR",
                     help="Node 0's address, for a multi-node plan (as `ddpboot --master-addr`)."),
    ] = None,
    master_port: Annotated[
        int | None,
        typer.Option("--master-port", "--master_port", envvar="PET_MASTER_PORT",
                     help="The store's port, for a multi-node plan (as `ddpboot --master-port`)."),
    ] = None,
) -> None:
    """Show which GPU each rank would get, and what cuda:0 means inside each worker. Starts nothing."""
    plan = plan_for(selection, master_addr=master_addr, master_port=master_port)
    if as_json:
        data = plan.to_json()
        data.setdefault("cluster", plan.cluster)
        print(json.dumps(data, indent=2))
    else:
        render_plan(plan)


@tools.command("gpus", epilog=INDEX_RULES)
@handle_errors
def gpus_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the inventory as one JSON object.")] = False,
    exclude: Annotated[str | None, typer.Option("--exclude", help="Mark these GPUs excluded.")] = None,
    max_used_memory: Annotated[
        str, typer.Option("--max-used-memory", help="Busy above this memory in use.")
    ] = "256MiB",
    max_util: Annotated[
        int, typer.Option("--max-util", help="Busy above this utilization (percent).")
    ] = DEFAULT_MAX_UTIL,
) -> None:
    """List the machine's GPUs (NVML, or DDPBOOT_FAKE_GPUS): free, busy, excluded or not visible."""
    env = os.environ
    req = parse_request(
        exclude=exclude, max_used_memory=parse_size(max_used_memory, "--max-used-memory"), max_util=max_util
    )
    inventory = load_inventory(env)
    records = gpu_states(inventory, req, env)
    if as_json:
        print(json.dumps({"gpus": records, "source": inventory.source, "notes": list(inventory.notes)}, indent=2))
    else:
        render_gpus(records, inventory)


@tools.command("smoke", epilog=INDEX_RULES)
@handle_errors
@with_selection
def smoke_cmd(
    selection: Selection,
    checks: Annotated[
        str | None,
        typer.Option("--checks", help="Run only these checks (comma list). Default: all. Names: "
                     "mapping, all_reduce, broadcast, all_gather, reduce_scatter, barrier, ddp, bandwidth, "
                     "isolation, timing."),
    ] = None,
    max_bytes: Annotated[
        str, typer.Option("--max-bytes", help="Largest all_reduce for the bandwidth check (capped to free memory).")
    ] = "64MiB",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds for the whole run; a hang becomes a failed check.")
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    junit: Annotated[
        str | None, typer.Option("--junit-xml", help="Also write a JUnit XML report here (for CI systems).")
    ] = None,
) -> None:
    """Run a multi-GPU self-test on the planned ranks: mapping, collectives, DDP, bandwidth, isolation, timing.

    Exit 0 only when every check passed."""
    from ddpboot.smoke import junit_xml, parse_checks, render, run_smoke

    names = parse_checks(checks)
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: give a positive number of seconds.")
    plan = plan_for(selection)
    report = run_smoke(plan, names, parse_size(max_bytes, "--max-bytes"), timeout)
    if junit:
        with open(junit, "w") as f:
            f.write(junit_xml(report))
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        render(report, _console())
    raise typer.Exit(0 if report.passed else 1)


def main(argv: list[str] | None = None) -> None:
    """Entry point: a tool when the first argument names one, else a job."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in TOOLS:
        tools(args, prog_name="ddpboot")
    else:
        from ddpboot.cli.run import run_app

        run_app(args, prog_name="ddpboot")
