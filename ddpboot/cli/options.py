"""The option groups the commands share, each declared once: the GPU selection (a job, `plan`, `smoke`, and a subset
for `gpus`) and the node options (a job, `plan`, `smoke`). A command decorated with `with_options` receives each
group as one raw object (`selection: SelectionOptions`, `nodes: NodeOptions`); launch/config.py turns them into a
configuration, the same way for every command.

An option left at its default is passed on as None where the default must not count as a choice (an explicit
`--node-rank 0` overrides SLURM's node rank, the default 0 does not), and a command that takes `from_env` learns
which options came from their environment variable (PET_NNODES for --nnodes), so that an error can say so.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from typer.models import ArgumentInfo

from ddpboot.launch.config import HostOptions, NodeOptions, SelectionOptions

F = TypeVar("F", bound=Callable[..., Any])

_SEL = "GPU selection"  # the options most jobs set: `ddpboot -h` shows this panel first
_MORE = "More GPU selection"
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
                metavar="N|gpu|auto|cpu",
                help="Ranks on this node: N, `gpu` (every allowed GPU), `auto` (every free GPU; one per core "
                "without GPUs) or `cpu` (one CPU rank per core). Default 1, or one per --gpus entry.",
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
                metavar="LIST",
                help="Exactly these GPUs, in this order (rank 0 gets the first), busy ones too: indices (0,2), "
                "ranges (0-3), UUIDs, PCI bus ids, MIG instances (3:1).",
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
                metavar="LIST",
                help="Never these GPUs (same forms as --gpus).",
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
                metavar="K",
                help="GPUs per rank; a rank's CUDA_VISIBLE_DEVICES lists them all and its first is cuda:0.",
                rich_help_panel=_MORE,
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
                metavar="rank|node",
                help="`rank`: each worker sees only its GPUs, as cuda:0, and LOCAL_RANK=0 (DDPBOOT_LOCAL_RANK "
                "has the index); `node`: all selected GPUs and the true LOCAL_RANK, as under torchrun.",
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
            typer.Option("--cpu", help="CPU ranks with gloo, even where GPUs exist.", rich_help_panel=_SEL),
        ],
    ),
    inspect.Parameter(
        "max_used_memory",
        inspect.Parameter.KEYWORD_ONLY,
        default=SelectionOptions.max_used_memory,
        annotation=Annotated[
            str,
            typer.Option(
                "--max-used-memory",
                metavar="SIZE",
                help="A GPU with more memory in use than this counts as busy for automatic selection.",
                rich_help_panel=_MORE,
            ),
        ],
    ),
    inspect.Parameter(
        "max_util",
        inspect.Parameter.KEYWORD_ONLY,
        default=SelectionOptions.max_util,
        annotation=Annotated[
            int,
            typer.Option(
                "--max-util",
                metavar="PCT",
                help="A GPU busier than this utilization (percent) counts as busy for automatic selection.",
                rich_help_panel=_MORE,
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
                metavar="auto|none|CORES",
                help="`auto`: bind each rank to the cores near its GPU (NVML), split fairly among ranks sharing "
                "them, within the cores ddpboot may use; `none`: no binding; a list (0-15) split among the ranks, "
                "or one list per rank separated by ';' (0-7;8-15). Unless OMP_NUM_THREADS is set, each rank gets "
                "its share of cores as OMP_NUM_THREADS.",
                rich_help_panel=_MORE,
            ),
        ],
    ),
    inspect.Parameter(
        "oversubscribe",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[
            bool,
            typer.Option(
                "--oversubscribe",
                envvar="DDPBOOT_OVERSUBSCRIBE",
                help="Start more ranks than 16 per usable CPU core (refused otherwise). The process and open-file "
                "limits (ulimit -u, ulimit -n) still apply.",
                rich_help_panel=_MORE,
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
                rich_help_panel=_MORE,
            ),
        ],
    ),
]


_NODE_HELP_MASTER_ADDR = (
    "The store's address, given to workers as MASTER_ADDR. One node: default 127.0.0.1 (the store listens on "
    "loopback only); another address of this machine makes it listen there. Several nodes: node 0's address."
)


def _node_option(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


NODE_PARAMS = [
    inspect.Parameter(
        "nnodes",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            str | None,
            typer.Option("--nnodes", envvar="PET_NNODES", rich_help_panel=_NODES, metavar="N|MIN:MAX",
                         help="Number of nodes: N (static), or MIN:MAX for an elastic job through torch's c10d "
                         "rendezvous (needs --rdzv-backend c10d and --rdzv-endpoint HOST:PORT)."),
        ],
    ),
    inspect.Parameter(
        "node_rank",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            int | None,
            typer.Option(
                "--node-rank", "--node_rank", envvar="PET_NODE_RANK", help="This node's index.", rich_help_panel=_NODES,
                metavar="N",
            ),
        ],
    ),
    _node_option("master_addr", Annotated[str | None, typer.Option(
        "--master-addr", "--master_addr", envvar="PET_MASTER_ADDR", rich_help_panel=_NODES, metavar="HOST",
        help=_NODE_HELP_MASTER_ADDR)], None),
    _node_option("master_port", Annotated[int | None, typer.Option(
        "--master-port", "--master_port", envvar="PET_MASTER_PORT", rich_help_panel=_NODES, metavar="PORT",
        help="The store's port (MASTER_PORT). Default: a free port that ddpboot binds itself, so no other process "
        "can take it between choice and use; 29500 for several nodes. A port in use is an error.")], None),
    _node_option("rdzv_backend", Annotated[str, typer.Option(
        "--rdzv-backend", "--rdzv_backend", envvar="PET_RDZV_BACKEND", rich_help_panel=_NODES, metavar="static|c10d",
        help="torchrun's rendezvous backend. With --nnodes MIN:MAX: c10d (torch's own rendezvous). Otherwise "
        "accepted (static or c10d); the workers' store is ddpboot's.")], NodeOptions.rdzv_backend),
    _node_option("rdzv_endpoint", Annotated[str, typer.Option(
        "--rdzv-endpoint", "--rdzv_endpoint", envvar="PET_RDZV_ENDPOINT", rich_help_panel=_NODES,
        metavar="HOST:PORT",
        help="HOST:PORT of the rendezvous store. Elastic (--nnodes MIN:MAX): torch's c10d rendezvous there, hosted "
        "by the launcher on HOST. Fixed node count: stands for --master-addr/--master-port. One node: HOST must be "
        "this machine; PORT is used like --master-port.")], NodeOptions.rdzv_endpoint),
    _node_option("standalone", Annotated[bool, typer.Option(
        "--standalone", envvar="PET_STANDALONE", rich_help_panel=_NODES,
        help="torchrun's single-node mode. ddpboot's one-node default already is: a private store on loopback "
        "(torchrun's listens on every interface).")], NodeOptions.standalone),
    _node_option("local_addr", Annotated[str | None, typer.Option(
        "--local-addr", "--local_addr", envvar="PET_LOCAL_ADDR", rich_help_panel=_NODES, metavar="HOST",
        help="This node's address for other nodes: where node group rank 0 serves the workers' store in an "
        "elastic job (default: its address on the route to the rendezvous endpoint).")], None),
]


_HOSTS = "Hosts over ssh"
HOST_PARAMS = [
    _node_option("hostfile", Annotated[str | None, typer.Option(
        "--hostfile", rich_help_panel=_HOSTS, metavar="FILE",
        help="Run one launcher per host of FILE over ssh (DeepSpeed's and Open MPI's format: `HOST slots=N` a line, "
        "`gpus=0,2` or `exclude=0` per host, `#` comments); the first host is node 0.")], None),
    _node_option("hosts", Annotated[str | None, typer.Option(
        "--hosts", rich_help_panel=_HOSTS, metavar="H1:N,H2:N",
        help="The hosts on the command line, as Horovod's -H: HOST or HOST:SLOTS, comma-separated.")], None),
    _node_option("ssh_port", Annotated[int | None, typer.Option(
        "--ssh-port", rich_help_panel=_HOSTS, metavar="PORT",
        help="The hosts' sshd port (ssh -p); default: your ssh config's.")], None),
    _node_option("ssh_identity_file", Annotated[str | None, typer.Option(
        "--ssh-identity-file", rich_help_panel=_HOSTS, metavar="KEY",
        help="The private key for the hosts (ssh -i); default: your ssh config and agent.")], None),
    _node_option("env", Annotated[list[str] | None, typer.Option(
        "--env", rich_help_panel=_HOSTS, metavar="NAME[=VALUE]",
        help="One more variable for every host's launcher and ranks (repeat the option): NAME from here, or "
        "NAME=VALUE. PATH, PYTHON*, NCCL_*, GLOO_*, CUDA_*, TORCH_* and a few more go anyway (docs/clusters.md).")],
        None),
]


def _host_options(**values: Any) -> HostOptions:
    return HostOptions(**{**values, "env": tuple(values.get("env") or ())})


@dataclass(frozen=True)
class OptionGroup:
    """Options declared once (`params`) that a command receives as one object, built by `make`."""

    name: str  # the command's parameter that receives the object
    params: Sequence[inspect.Parameter]
    make: Callable[..., Any]


SELECTION = OptionGroup("selection", SELECTION_PARAMS, SelectionOptions)
NODES = OptionGroup("nodes", NODE_PARAMS, NodeOptions)
HOSTS = OptionGroup("hosts", HOST_PARAMS, _host_options)


def only(group: OptionGroup, *names: str) -> OptionGroup:
    """The same group with only these options on the command (the others keep their defaults)."""
    return OptionGroup(group.name, [p for p in group.params if p.name in names], group.make)


def options_from_env(ctx: typer.Context) -> dict[str, str]:
    """The options of the running command whose value came from their environment variable: option → variable."""
    import os

    out = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if source is not None and source.name == "ENVIRONMENT" and param.opts:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
            var = next((str(n) for n in names if n and os.environ.get(str(n)) is not None), None)
            if var is not None:
                out[str(param.opts[0])] = var
    return out


def with_options(*groups: OptionGroup) -> Callable[[F], F]:
    """Add each group's options to a command, which receives them as one object per group. A command that takes
    `from_env` receives options_from_env; one that takes `ctx: typer.Context` receives the click context."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)  # an explicit __signature__ is never evaluated later
        names = {g.name for g in groups} | {"from_env"}
        own = [p for p in sig.parameters.values() if p.name not in names]
        wants_ctx, wants_env = "ctx" in sig.parameters, "from_env" in sig.parameters
        if not wants_ctx:
            own.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs["ctx"] if wants_ctx else kwargs.pop("ctx")
            for group in groups:
                kwargs[group.name] = group.make(**{p.name: kwargs.pop(p.name) for p in group.params})
            if wants_env:
                kwargs["from_env"] = options_from_env(ctx)
            return fn(*args, **kwargs)

        # Arguments first, then the groups' options (the ones most jobs set, so `--help` shows them first), then the
        # command's own. Typer passes every value by keyword, so all options can be keyword-only.
        kw = inspect.Parameter.KEYWORD_ONLY
        arguments = [p.replace(kind=kw) for p in own if _is_argument(p)]
        shared = [p for g in groups for p in g.params]
        params = arguments + shared + [p.replace(kind=kw) for p in own if not _is_argument(p)]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


def _is_argument(param: inspect.Parameter) -> bool:
    """Whether a command parameter is a positional argument (typer.Argument), whose order on the line matters."""
    return any(isinstance(meta, ArgumentInfo) for meta in getattr(param.annotation, "__metadata__", ()))
