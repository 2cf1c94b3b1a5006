"""Every option of the commands, declared once, as one row of a table: the field of the dataclass that receives it
(which gives the option its type and its default), its spellings, environment variable, panel and help, and for a
closed set of words its `Choice` (the metavar `a|b|c` help shows and the words completion offers). The groups the
commands share are here: the GPU selection (a job, `plan`, `smoke`, and a subset for `gpus`), the node options and
the hosts over ssh (a job, `plan`); the run command's own rows are in run_options.py.

A command decorated with `with_options` receives each group as one raw object (`selection: SelectionOptions`,
`nodes: NodeOptions`); launch/config.py turns them into a configuration, the same way for every command. An option
left at its default is passed on as None where the default must not count as a choice (an explicit `--node-rank 0`
overrides SLURM's node rank, the default None does not), and a command that takes `from_env` learns which options
came from their environment variable (PET_NNODES for --nnodes), so that an error can say so.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import typer
from typer.models import ArgumentInfo

from ddpboot.contract import TORCHRUN_MASTER_PORT, Choice, Isolation
from ddpboot.launch.config import NPROC_MODES, HostOptions, NodeOptions, RdzvBackend, SelectionOptions

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Opt:
    """One row: the option that fills the field `name` of its group's dataclass, and how the command line shows
    it."""

    name: str  # the field
    names: tuple[str, ...]  # its spellings: the first long one names it in help and errors
    help: str = ""
    panel: str | None = None  # the help panel it is shown in
    env: str | list[str] | None = None  # the environment variable(s) that give its value when it is not typed
    metavar: str | None = None  # what it takes, in help; a Choice's words (`warn|strict|off`) by default
    choice: type[Choice] | None = None  # its closed set of words
    complete: Sequence[str] = ()  # the words completion offers for an option that is no closed set (--nproc)
    hidden: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # what else typer.Option takes (is_eager, callback, ...)

    def words(self) -> list[str]:
        return list(self.choice.values() if self.choice else self.complete)

    def info(self) -> Any:
        """The typer.Option of this row."""
        metavar = self.metavar or ("|".join(self.choice.values()) if self.choice else None)
        words = self.words()
        return typer.Option(*self.names, envvar=self.env, metavar=metavar, help=self.help or None,
                            rich_help_panel=self.panel, hidden=self.hidden,
                            autocompletion=(lambda: words) if words else None, **self.extra)


def opt(name: str, *names: str, **row: Any) -> Opt:
    """A row: `opt("gpus", "--gpus", env="DDPBOOT_GPUS", help=...)` fills the field `gpus`."""
    return Opt(name, names, **row)


def _cli_type(hint: Any) -> Any:
    """The type the command line parses for a field: a tuple field takes the option repeated (None when not
    given), and a duration that the pytest plugin may give as seconds (`str | float`) is a string here."""
    args = typing.get_args(hint)
    if _repeated(hint):
        return list[args[0]] | None  # type: ignore[valid-type]
    if str in args and float in args:
        return functools.reduce(operator.or_, [a for a in args if a is not float])
    return hint


@dataclass(frozen=True)
class OptionGroup:
    """Options a command receives as one object: the rows, each naming a field of `record`, and `make`, which builds
    the object from their values (default: the record itself, repeated options as tuples)."""

    name: str  # the command's parameter that receives the object
    record: type
    rows: Sequence[Opt]
    make: Callable[..., Any] | None = None

    @functools.cached_property
    def params(self) -> list[inspect.Parameter]:
        """The command's parameters, one per row, typed and defaulted by the record's field (a repeated option's
        default is None: not given)."""
        hints = typing.get_type_hints(self.record)
        defaults = {f.name: f.default for f in dataclasses.fields(self.record)}
        return [inspect.Parameter(row.name, inspect.Parameter.KEYWORD_ONLY,
                                  default=None if _repeated(hints[row.name]) else defaults[row.name],
                                  annotation=Annotated[_cli_type(hints[row.name]), row.info()])
                for row in self.rows]

    def build(self, values: dict[str, Any]) -> Any:
        if self.make is not None:
            return self.make(**values)
        hints = typing.get_type_hints(self.record)
        return self.record(**{k: tuple(v or ()) if _repeated(hints[k]) else v for k, v in values.items()})


def _repeated(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple


def only(group: OptionGroup, *names: str) -> OptionGroup:
    """The same group with only these options on the command (the others keep their defaults)."""
    return OptionGroup(group.name, group.record, [r for r in group.rows if r.name in names], group.make)


_SEL = "GPU selection"  # the options most jobs set: `ddpboot -h` shows this panel first
_MORE = "More GPU selection"
_NODES = "Multi-node"
_HOSTS = "Hosts over ssh"

SELECTION = OptionGroup("selection", SelectionOptions, [
    opt("nproc", "--nproc", "--nproc-per-node", "--nproc_per_node", env="PET_NPROC_PER_NODE", panel=_SEL,
        metavar="N|" + "|".join(NPROC_MODES), complete=NPROC_MODES,
        help="Ranks on this node: N, `gpu` (every allowed GPU), `auto` (every free GPU; one per core without GPUs) "
        "or `cpu` (one CPU rank per core). Default 1, or one per --gpus entry."),
    opt("gpus", "--gpus", env="DDPBOOT_GPUS", metavar="LIST", panel=_SEL,
        help="Exactly these GPUs, in this order (rank 0 gets the first), busy ones too: indices (0,2), ranges "
        "(0-3), UUIDs, PCI bus ids, MIG instances (3:1)."),
    opt("exclude", "--exclude", env="DDPBOOT_EXCLUDE", metavar="LIST", panel=_SEL,
        help="Never these GPUs (same forms as --gpus)."),
    opt("gpus_per_proc", "--gpus-per-proc", metavar="K", panel=_MORE,
        help="GPUs per rank; a rank's CUDA_VISIBLE_DEVICES lists them all and its first is cuda:0."),
    opt("isolation", "--isolation", env="DDPBOOT_ISOLATION_MODE", choice=Isolation, panel=_SEL,
        help="`rank`: each worker sees only its GPUs, as cuda:0, and LOCAL_RANK=0 (DDPBOOT_LOCAL_RANK has the "
        "index); `node`: all selected GPUs and the true LOCAL_RANK, as under torchrun."),
    opt("cpu", "--cpu", panel=_SEL, help="CPU ranks with gloo, even where GPUs exist."),
    opt("max_used_memory", "--max-used-memory", metavar="SIZE", panel=_MORE,
        help="A GPU with more memory in use than this counts as busy for automatic selection."),
    opt("max_util", "--max-util", metavar="PCT", panel=_MORE,
        help="A GPU busier than this utilization (percent) counts as busy for automatic selection."),
    opt("cpu_affinity", "--cpu-affinity", env="DDPBOOT_CPU_AFFINITY", metavar="auto|none|CORES", panel=_MORE,
        complete=("auto", "none"),
        help="`auto`: bind each rank to the cores near its GPU (NVML), split fairly among ranks sharing them, within "
        "the cores ddpboot may use; `none`: no binding; a list (0-15) split among the ranks, or one list per rank "
        "separated by ';' (0-7;8-15). Unless OMP_NUM_THREADS is set, each rank gets its share of cores as "
        "OMP_NUM_THREADS."),
    opt("oversubscribe", "--oversubscribe", env="DDPBOOT_OVERSUBSCRIBE", panel=_MORE,
        help="Start more ranks than 16 per usable CPU core (refused otherwise). The process and open-file limits "
        "(ulimit -u, ulimit -n) still apply."),
    opt("share", "--share", panel=_MORE,
        help="Use GPUs named in --gpus even if another ddpboot job holds them (their locks are not taken)."),
])

NODES = OptionGroup("nodes", NodeOptions, [
    opt("nnodes", "--nnodes", env="PET_NNODES", panel=_NODES, metavar="N|MIN:MAX",
        help="Number of nodes: N (static), or MIN:MAX for an elastic job through torch's c10d rendezvous (needs "
        "--rdzv-backend c10d and --rdzv-endpoint HOST:PORT)."),
    opt("node_rank", "--node-rank", "--node_rank", env="PET_NODE_RANK", panel=_NODES, metavar="N",
        help="This node's index."),
    opt("master_addr", "--master-addr", "--master_addr", env="PET_MASTER_ADDR", panel=_NODES, metavar="HOST",
        help="The store's address, given to workers as MASTER_ADDR. One node: default 127.0.0.1 (the store listens "
        "on loopback only); another address of this machine makes it listen there. Several nodes: node 0's "
        "address."),
    opt("master_port", "--master-port", "--master_port", env="PET_MASTER_PORT", panel=_NODES, metavar="PORT",
        help="The store's port (MASTER_PORT). Default: a free port that ddpboot binds itself, so no other process "
        f"can take it between choice and use; {TORCHRUN_MASTER_PORT} for several nodes. A port in use is an error."),
    opt("rdzv_backend", "--rdzv-backend", "--rdzv_backend", env="PET_RDZV_BACKEND", panel=_NODES,
        choice=RdzvBackend,
        help="torchrun's rendezvous backend. With --nnodes MIN:MAX: c10d (torch's own rendezvous). Otherwise "
        "accepted (static or c10d); the workers' store is ddpboot's."),
    opt("rdzv_endpoint", "--rdzv-endpoint", "--rdzv_endpoint", env="PET_RDZV_ENDPOINT", panel=_NODES,
        metavar="HOST:PORT",
        help="HOST:PORT of the rendezvous store. Elastic (--nnodes MIN:MAX): torch's c10d rendezvous there, hosted "
        "by the launcher on HOST. Fixed node count: stands for --master-addr/--master-port. One node: HOST must be "
        "this machine; PORT is used like --master-port."),
    opt("standalone", "--standalone", env="PET_STANDALONE", panel=_NODES,
        help="torchrun's single-node mode. ddpboot's one-node default already is: a private store on loopback "
        "(torchrun's listens on every interface)."),
    opt("local_addr", "--local-addr", "--local_addr", env="PET_LOCAL_ADDR", panel=_NODES, metavar="HOST",
        help="This node's address for other nodes: where node group rank 0 serves the workers' store in an elastic "
        "job (default: its address on the route to the rendezvous endpoint)."),
])

HOSTS = OptionGroup("hosts", HostOptions, [
    opt("hostfile", "--hostfile", panel=_HOSTS, metavar="FILE",
        help="Run one launcher per host of FILE over ssh (DeepSpeed's and Open MPI's format: `HOST slots=N` a line, "
        "`gpus=0,2` or `exclude=0` per host, `#` comments); the first host is node 0."),
    opt("hosts", "--hosts", panel=_HOSTS, metavar="H1:N,H2:N",
        help="The hosts on the command line, as Horovod's -H: HOST or HOST:SLOTS, comma-separated."),
    opt("ssh_port", "--ssh-port", panel=_HOSTS, metavar="PORT",
        help="The hosts' sshd port (ssh -p); default: your ssh config's."),
    opt("ssh_identity_file", "--ssh-identity-file", panel=_HOSTS, metavar="KEY",
        help="The private key for the hosts (ssh -i); default: your ssh config and agent."),
    opt("env", "--env", panel=_HOSTS, metavar="NAME[=VALUE]",
        help="One more variable for every host's launcher and ranks (repeat the option): NAME from here, or "
        "NAME=VALUE. PATH, PYTHON*, NCCL_*, GLOO_*, CUDA_*, TORCH_* and a few more go anyway (docs/clusters.md)."),
])


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
                kwargs[group.name] = group.build({p.name: kwargs.pop(p.name) for p in group.params})
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
