"""The selection options a job, `plan` and `smoke` share, and which options the user actually gave.

Option values are read once, in the command function: an option left at its default is passed on as None where
the default must not count as a choice (an explicit `--node-rank 0` overrides SLURM's node rank, the default 0 does
not), so nothing below the command asks click which options were given.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from typer.models import ArgumentInfo

from ddpboot.errors import UsageError
from ddpboot.nodes.static import NodeSetup, parse_nnodes, resolve_nodes
from ddpboot.selection.request import DEFAULT_MAX_UTIL, Request, parse_request
from ddpboot.units import parse_size

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Selection:
    """The selection options as given; nnodes and node_rank are None when not given (SLURM's, else one node)."""

    nproc: str | None
    gpus: str | None
    exclude: str | None
    gpus_per_proc: int
    isolation: str
    cpu: bool
    max_used_memory: str
    max_util: int
    nnodes: str | None
    node_rank: int | None
    cpu_affinity: str
    share: bool


_SEL = "GPU selection"
_NODES = "Multi-node"
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
            typer.Option("--nnodes", envvar="PET_NNODES", rich_help_panel=_NODES,
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
                "--node-rank", "--node_rank", envvar="PET_NODE_RANK", help="This node's index.", rich_help_panel=_NODES
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
_NONE_UNLESS_GIVEN = ("nnodes", "node_rank")


def options_given(ctx: typer.Context) -> frozenset[str]:
    """The options of the running command that came from the command line or their environment variable."""
    given = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given.add(name)
    return frozenset(given)


def with_selection(fn: F) -> F:
    """Add the selection options to a command; the command receives them as one `selection: Selection`. The click
    context (which says which options were given) reaches the command too if it takes `ctx: typer.Context`."""
    sig = inspect.signature(fn, eval_str=True)  # an explicit __signature__ is never evaluated later
    own = [p for p in sig.parameters.values() if p.name != "selection"]
    wants_ctx = "ctx" in sig.parameters
    if not wants_ctx:
        own.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = options_given(kwargs["ctx"] if wants_ctx else kwargs.pop("ctx"))
        values = {name: kwargs.pop(name) for name in _SELECTION_NAMES}
        for name in _NONE_UNLESS_GIVEN:
            if name not in given:
                values[name] = None
        return fn(*args, selection=Selection(**values), **kwargs)

    # Arguments first, then the selection options (the ones most jobs set, so `--help` shows them first), then the
    # command's own. Typer passes every value by keyword, so all options can be keyword-only.
    kw = inspect.Parameter.KEYWORD_ONLY
    arguments = [p.replace(kind=kw) for p in own if _is_argument(p)]
    params = arguments + SELECTION_PARAMS + [p.replace(kind=kw) for p in own if not _is_argument(p)]
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]


def _is_argument(param: inspect.Parameter) -> bool:
    """Whether a command parameter is a positional argument (typer.Argument), whose order on the line matters."""
    return any(isinstance(meta, ArgumentInfo) for meta in getattr(param.annotation, "__metadata__", ()))


def flag_nodes(
    sel: Selection, env: Mapping[str, str], master_addr: str | None = None, master_port: int | None = None
) -> NodeSetup:
    """Node count, node rank and store address for `plan` and `smoke`: flags (given ones only) > SLURM step > one
    node. An elastic range has no fixed plan: parse_nnodes says so."""
    nnodes = parse_nnodes(sel.nnodes) if sel.nnodes is not None else None
    return resolve_nodes(env, nnodes, sel.node_rank, master_addr, master_port)


def selection_request(sel: Selection, nodes: NodeSetup) -> Request:
    """The Request for these options on this node."""
    if sel.gpus is not None and not sel.gpus.strip():
        raise UsageError("--gpus '': the list is empty, so it names no GPU. Name GPUs (--gpus 0,1), leave --gpus "
                         "out to let ddpboot choose free ones, or use --cpu for CPU ranks.")
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
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        cpu_affinity=sel.cpu_affinity,
        share=sel.share,
    )
