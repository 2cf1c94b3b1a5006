"""Where a launcher's node count, node rank and store address come from: flags, a scheduler, or one node.

Precedence: explicit flags (`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`, or their PET_* defaults)
win; a launcher started as one task per node by a scheduler gets what the flags do not from it, and a flag that
contradicts it wins with a note. The schedulers, in order (the variables of the process itself first, as in
cluster/__init__.py): an MPI rank (`mpirun --map-by ppr:1:node ddpboot ...`: node rank = MPI rank, node count = MPI
size, store address as cluster/mpi.py reads it for ranks), a jsrun task (LSF, the same from JSM_NAMESPACE_*), a srun
step (SLURM), a pbsdsh task (`pbsdsh -u ddpboot ...`: PBS_NODENUM of the node file's hosts, the store on the first).
Several MPI or jsrun launchers on one host are several nodes of the job (they share its GPUs through the GPU
locks, and `plan` says so); SLURM's node rank is the host's, so there one launcher per host is required. In a
Kubeflow PyTorchJob pod of several nodes without PET_MASTER_ADDR, MASTER_ADDR and
MASTER_PORT name node 0 (source "kubernetes", cluster/kubernetes.py); otherwise the job is one node with its store on
loopback, on a port the launcher binds itself (no port race). `ddpboot plan` prints which source was used.

An elastic range (`--nnodes MIN:MAX`) has no fixed node rank or node count: torch's c10d rendezvous decides them at
each round (launch/elastic/). Its NodeSetup (source "elastic") records the range, the rendezvous endpoint and the
address this node serves the workers' store on when it is node rank 0 of a round (torch calls it group rank 0).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ddpboot.cluster.base import ClusterEnvironment, first_set
from ddpboot.cluster.kubernetes import pytorchjob_master
from ddpboot.cluster.lsf import JsrunEnvironment
from ddpboot.cluster.mpi import MpiEnvironment
from ddpboot.cluster.parallel import unknown_launch
from ddpboot.cluster.pbs import in_pbsdsh_task, pbs_node_info
from ddpboot.cluster.slurm import in_srun_step, slurm_node_info
from ddpboot.contract import TORCHRUN_MASTER_PORT, is_tcp_port
from ddpboot.errors import UsageError
from ddpboot.units import OptionChoice, plural

DEFAULT_RDZV_PORT = 29400  # torch's c10d rendezvous default port (an endpoint given as HOST only)
LOOPBACK = "127.0.0.1"
UNKNOWN_LAUNCH_FIX = (  # what to do where cluster/parallel.py sees a launch ddpboot cannot read
    "Give the nodes yourself, the same on every launcher but the node rank (--nnodes N --node-rank R --master-addr "
    "HOST; under OpenPBS's pbsdsh: pbsdsh -- bash -lc 'ddpboot --nnodes N --node-rank $PBS_NODENUM --master-addr "
    "FIRST_HOST ...'), or start one ddpboot per node with mpirun, srun or jsrun; if no launcher started this ddpboot "
    "(the variables were left in the shell), unset them."
)


class NodeSource(str, Enum):
    """Where a launcher's node setup came from (`ddpboot plan` prints it; JSON shows the value)."""

    SINGLE = "single"  # one node, store on loopback
    FLAGS = "flags"  # --nnodes/--node-rank/--master-addr (or their PET_* variables)
    SLURM = "slurm"  # a srun step, one launcher per node
    MPI = "mpi"  # an MPI rank (mpirun --map-by ppr:1:node), one launcher per node
    LSF = "lsf"  # a jsrun task, one launcher per node
    PBS = "pbs"  # a pbsdsh -u task, one launcher per host
    KUBERNETES = "kubernetes"  # a Kubeflow PyTorchJob pod's MASTER_ADDR / MASTER_PORT
    ELASTIC = "elastic"  # --nnodes MIN:MAX through torch's c10d rendezvous

    def __str__(self) -> str:
        return self.value


class RdzvBackend(OptionChoice):
    """torchrun's --rdzv-backend values ddpboot runs: `static` (ddpboot's store) and `c10d` (torch's rendezvous);
    etcd is refused by name, with what to use instead."""

    STATIC = "static", "the default"
    C10D = "c10d"

    @classmethod
    def refusal(cls, text: str | None, where: str) -> str:
        if cls.normal(text) in ("etcd", "etcd-v2"):
            return (f"{where} {text}: ddpboot has no etcd rendezvous and would not use it. A fixed node count meets "
                    "at ddpboot's store (--master-addr/--master-port, or --rdzv-backend static); an elastic --nnodes "
                    "MIN:MAX runs through torch's c10d rendezvous (--rdzv-backend c10d --rdzv-endpoint HOST:PORT).")
        return f"{where} {text!r}: ddpboot takes {cls.listing()}."


def check_port(port: int, option: str) -> int:
    """`port` if peers can connect to it (1-65535); a UsageError naming `option` otherwise."""
    if not is_tcp_port(port):
        raise UsageError(f"{option} {port} is not a TCP port (1-65535).")
    return port


@dataclass(frozen=True)
class NodeSetup:
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int | None  # None: one node, the launcher binds a free loopback port itself
    source: NodeSource
    notes: tuple[str, ...] = ()
    # Elastic jobs only: the node range and torch's c10d rendezvous endpoint (HOST:PORT). nnodes is then MAX and
    # node_rank 0: a placeholder plan until a rendezvous round says which node this is.
    min_nodes: int | None = None
    max_nodes: int | None = None
    rdzv_endpoint: str | None = None
    addr_option: str = ""  # the option that named node 0's address, for messages ("": see master_addr_option)
    port_from: str = ""  # how a scheduler's port was derived (a port in use says so); "": a flag or MASTER_PORT

    @property
    def elastic(self) -> bool:
        """An elastic range: torch's c10d rendezvous decides node rank and node count at each round."""
        return self.source is NodeSource.ELASTIC

    @property
    def master_addr_option(self) -> str:
        """What named node 0's address, for messages: --rdzv-endpoint where it did, a PyTorchJob pod's
        MASTER_ADDR, else --master-addr."""
        if self.addr_option:
            return self.addr_option
        return "MASTER_ADDR" if self.source is NodeSource.KUBERNETES else "--master-addr"

    def start_hint(self) -> str:
        """How every node's launcher is started with this node source, for the check-in's messages."""
        last = self.nnodes - 1
        return {
            NodeSource.SLURM: "srun starts one launcher per node of the step (srun --ntasks-per-node=1 ddpboot ...)",
            NodeSource.MPI: "the MPI launcher starts one ddpboot per node (mpirun -np N --map-by ppr:1:node ddpboot "
                            "...; Hydra: mpiexec -n N -ppn 1 ddpboot ...)",
            NodeSource.LSF: "jsrun starts one ddpboot per host (jsrun -r 1 -a 1 ddpboot ...)",
            NodeSource.PBS: "pbsdsh -u starts one ddpboot on every host of the job (pbsdsh -u -- bash -lc '... "
                            "ddpboot ...'), its node rank PBS_NODENUM",
            NodeSource.KUBERNETES: "every pod of the PyTorchJob runs one ddpboot, its node rank PET_NODE_RANK",
        }.get(self.source, f"start one ddpboot per node with the same --nnodes, --master-addr and --master-port and "
                           f"node ranks 0..{last}")

    def describe(self) -> str:
        if self.source is NodeSource.SINGLE:
            return "one node, store on loopback"
        if self.elastic:
            return (f"elastic: {self.min_nodes} to {self.max_nodes} nodes through the c10d rendezvous at "
                    f"{self.rdzv_endpoint}; this node's store address {self.master_addr}")
        return (f"{self.source}: node {self.node_rank} of {self.nnodes}, store at "
                f"{self.master_addr}:{self.master_port}")


def resolve_nodes(
    env: Mapping[str, str],
    nnodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    step: str = "",
) -> NodeSetup:
    """Combine flags (None: not given) with the environment. Pure apart from reading `env` (and the files its
    variables name). `step`: what the launchers of one scheduler step share (its command), for a derived port."""
    if nnodes is not None and nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: a job has at least 1 node.")
    if master_port is not None:
        check_port(master_port, "--master-port")
    sched = scheduler_nodes(env, master_addr, master_port, nnodes, step) if nnodes is None or nnodes > 1 else None
    notes = _scheduler_notes(env, sched, nnodes, (nnodes, node_rank, master_addr, master_port))
    n = nnodes if nnodes is not None else (sched.nnodes if sched else 1)
    r = node_rank if node_rank is not None else (sched.node_rank if sched else 0)
    if not 0 <= r < n:
        raise UsageError(f"--node-rank {r} is outside 0..{n - 1} for {plural(n, 'node')}.")
    if n == 1:
        return NodeSetup(1, 0, master_addr or LOOPBACK, master_port, NodeSource.SINGLE, tuple(notes))
    pod = None if master_addr or sched else pytorchjob_master(env)
    if pod is not None:  # a Kubeflow PyTorchJob pod names node 0 only as MASTER_ADDR / MASTER_PORT
        master_addr, master_port = pod.addr, master_port or pod.port
        notes.append(pod.note())
    addr = master_addr or (sched.master_addr if sched else None)
    if not addr:
        slurm = " Inside SLURM, start ddpboot with srun to have it filled in." if env.get("SLURM_JOB_ID") else ""
        raise UsageError(
            f"--nnodes {n} needs --master-addr (or --rdzv-endpoint HOST:PORT): the address of node 0, where a "
            f"multi-node job's store runs (every node must reach it).{slurm}"
        )
    port = master_port or (sched.master_port if sched else TORCHRUN_MASTER_PORT)
    source = (sched.source if sched and (nnodes is None or node_rank is None)
              else NodeSource.KUBERNETES if pod else NodeSource.FLAGS)
    port_from = sched.port_from if sched and not master_port else ""
    return NodeSetup(n, r, addr, port, source, tuple(notes), port_from=port_from)


def _scheduler_notes(env: Mapping[str, str], sched: SchedulerNodes | None, nnodes: int | None,
                     flags: tuple[int | None, int | None, str | None, int | None]) -> list[str]:
    """The scheduler's notes and those of each flag that overrides it; no scheduler but signs of a parallel launch
    (cluster/parallel.py) and no --nnodes: an error, rather than a world of one per task."""
    if sched is None:
        unknown = unknown_launch(env, "this ddpboot launcher") if nnodes is None else None
        if unknown is not None:
            raise UsageError(f"{unknown}. {UNKNOWN_LAUNCH_FIX}")
        return []
    notes = list(sched.notes)
    for flag, mine, theirs, var in zip(("--nnodes", "--node-rank", "--master-addr", "--master-port"), flags,
                                       sched.values, sched.variables, strict=True):
        if mine is not None and mine != theirs:
            notes.append(f"{flag} {mine} overrides {sched.name}'s {theirs} (from {var}): the flag wins")
    return notes


@dataclass(frozen=True)
class SchedulerNodes:
    """What a scheduler that started this launcher as one task per node says about the nodes."""

    source: NodeSource
    name: str  # for notes: "SLURM", "MPI", ...
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    variables: tuple[str, str, str, str]  # where nnodes, node_rank, master_addr, master_port came from
    notes: tuple[str, ...] = ()
    port_from: str = ""  # how the scheduler's port was derived, for a port in use ("": MASTER_PORT or a flag)

    @property
    def values(self) -> tuple[int, int, str, int]:
        return self.nnodes, self.node_rank, self.master_addr, self.master_port


def scheduler_nodes(env: Mapping[str, str], master_addr: str | None = None, master_port: int | None = None,
                    nnodes: int | None = None, step: str = "") -> SchedulerNodes | None:
    """The scheduler that started this launcher, in the module docstring's order; None outside any. The flags'
    --master-addr / --master-port stand in for MASTER_ADDR / MASTER_PORT where the scheduler's variables do not
    name rank 0's host (MPI, jsrun, a pbsdsh task on a host without the node file, which needs --nnodes too)."""
    overlay = {**env, **({"MASTER_ADDR": master_addr} if master_addr else {}),
               **({"MASTER_PORT": str(master_port)} if master_port else {})}
    for cls, source, name in ((MpiEnvironment, NodeSource.MPI, "MPI"), (JsrunEnvironment, NodeSource.LSF, "jsrun")):
        if cls.detect(env):
            named = overlay.get("MASTER_ADDR", "").strip()
            ranks = cls({**overlay, "MASTER_ADDR": named or LOOPBACK})
            if not named and ranks.local_world_size < ranks.world_size:
                raise UsageError(_no_master(ranks, name, env))
            return _task_per_node(ranks, source, name)
    if in_srun_step(env):
        s = slurm_node_info(env)
        return SchedulerNodes(NodeSource.SLURM, "SLURM", s.nnodes, s.node_rank, s.master_addr, s.master_port,
                              ("SLURM_STEP_NUM_NODES", "SLURM_NODEID", "SLURM_STEP_NODELIST", "SLURM_JOB_ID"))
    if in_pbsdsh_task(env):
        p = pbs_node_info(overlay, nnodes, step)
        names = ("PBS_NODEFILE", "PBS_NODENUM", "PBS_NODEFILE") if first_set(env, ["PBS_NODEFILE"]) else (
            "--nnodes", "PBS_NODENUM", "MASTER_ADDR")
        derived = "" if first_set(overlay, ["MASTER_PORT"]) else "derived from PBS_JOBID and the command of this step"
        return SchedulerNodes(NodeSource.PBS, "PBS", p.nnodes, p.node_rank, p.master_addr, p.master_port,
                              (*names, "PBS_JOBID"), port_from=derived)
    return None


def scheduler_span(env: Mapping[str, str]) -> tuple[str, str] | None:
    """What says this launcher is one of several a scheduler started (for `--standalone` and `--nnodes 1`, which
    would make each a world of its own), and what to do instead; None when it is alone."""
    for cls, name, sizes, alone in ((MpiEnvironment, "MPI", "its size and rank", "mpirun -np 1"),
                                    (JsrunEnvironment, "jsrun", "JSM_NAMESPACE_SIZE and JSM_NAMESPACE_RANK",
                                     "jsrun -n 1")):
        if cls.detect(env):
            ranks = cls({**env, "MASTER_ADDR": LOOPBACK})
            if ranks.world_size < 2:
                return None
            if isinstance(ranks, MpiEnvironment):
                sizes = f"{ranks.flavour.name}'s {'/'.join(ranks.flavour.size[:1] + ranks.flavour.rank[:1])}"
            return (f"{name} started {ranks.world_size} ddpboot launchers",
                    f"ddpboot then takes the node count and node rank from {sizes} (one node per launcher); or "
                    f"start a single launcher ({alone})")
    if in_srun_step(env):
        spanned = slurm_node_info(env).nnodes
        return None if spanned < 2 else (
            f"this srun step spans {spanned} nodes",
            "ddpboot then takes the nodes from the step (SLURM_STEP_NUM_NODES, SLURM_NODEID); or run a step of one "
            "node (srun -N1)")
    if in_pbsdsh_task(env) and first_set(env, ["PBS_NODEFILE"]):
        hosts = pbs_node_info(env).nnodes
        return None if hosts < 2 else (
            f"pbsdsh started this launcher on one of {hosts} hosts",
            "ddpboot then takes the nodes from pbsdsh (the hosts of PBS_NODEFILE, PBS_NODENUM); or run it on one "
            "host (pbsdsh -n 0)")
    return None


def _no_master(ranks: ClusterEnvironment, name: str, env: Mapping[str, str]) -> str:
    """An MPI or jsrun launcher on several hosts that nothing names node 0's host for: which variables made ddpboot
    think so, how to name it, and what to do if they were only left in a shell."""
    if isinstance(ranks, MpiEnvironment):
        flavour = ranks.flavour
        given, forward, unset = ", ".join(flavour.given(env)), flavour.forward, flavour.unset_fix(env)
    else:
        names = ("JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_LOCAL_SIZE")
        given = ", ".join(f"{n}={env[n]}" for n in names if env.get(n))
        forward = "jsrun passes the environment on"
        unset = f"If jsrun did not start this process (the variables were left in a shell), unset them: unset " \
                f"{' '.join(n for n in names if env.get(n))}."
    return (f"this ddpboot launcher is {name} rank {ranks.global_rank} of {ranks.world_size}, on several hosts "
            f"({given}), and nothing names node 0's host (where {name} rank 0 runs and the job's store listens). "
            f"Pass --master-addr HOST (the same on every launcher), or export MASTER_ADDR before starting them "
            f"({forward}). {unset}")


def _task_per_node(ranks: ClusterEnvironment, source: NodeSource, name: str) -> SchedulerNodes:
    """One launcher per task: node rank = the task's rank, node count = the job's size."""
    notes: tuple[str, ...] = ()
    if ranks.local_world_size > 1:
        notes = (f"{name} started {ranks.local_world_size} ddpboot launchers on this host: each is a node of its own "
                 "(node rank = its rank), and they share this host's GPUs through the GPU locks",)
    return SchedulerNodes(source, name, ranks.world_size, ranks.global_rank, ranks.main_address, ranks.main_port,
                          (f"{name}'s size", f"{name}'s rank", "MASTER_ADDR", "MASTER_PORT"), notes)


def check_resolvable(host: str, timeout: float = 5.0, option: str = "--master-addr") -> str:
    """The IPv4/IPv6 address of `host`, or a UsageError within `timeout` seconds (a DNS lookup can hang)."""
    import concurrent.futures  # only for a name to look up: `ddpboot plan` and one-node jobs start without it

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout)
        # Join the lookup thread: the launcher forks workers next, which it does only without threads.
        pool.shutdown(wait=True)
    except concurrent.futures.TimeoutError:
        raise UsageError(
            f"{option} {host}: the name did not resolve within {timeout:.0f} s. Use an address every node "
            "can reach (an IP, or a name in /etc/hosts or DNS)."
        ) from None
    except OSError as exc:
        raise UsageError(
            f"{option} {host} does not resolve ({exc}). Use an address every node can reach."
        ) from None
    finally:
        pool.shutdown(wait=False)
    return str(infos[0][4][0])


def parse_node_range(text: str) -> tuple[int, int]:
    """`--nnodes N` → (N, N); torchrun's `MIN:MAX` → (MIN, MAX). Raises UsageError for anything else, MIN < 1 or
    MIN > MAX."""
    t = text.strip()
    lo, sep, hi = t.partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise UsageError(
            f"--nnodes {text!r} is not a number of nodes: give N (a fixed count) or MIN:MAX (an elastic range, "
            "e.g. 1:4)."
        ) from None
    if low < 1:
        raise UsageError(f"--nnodes {text}: a job has at least 1 node{f' (MIN is {low})' if sep else ''}.")
    if low > high:
        raise UsageError(f"--nnodes {text}: MIN ({low}) is above MAX ({high}); write {high}:{low}.")
    return low, high


def parse_nnodes(text: str) -> int:
    """`--nnodes N` or torchrun's fixed range `N:N` → N. An elastic range MIN:MAX (MIN < MAX) has no fixed node
    count: only the launcher runs it (through torch's c10d rendezvous), so anything that needs a count refuses it."""
    low, high = parse_node_range(text)
    if low != high:
        raise UsageError(
            f"--nnodes {text} is an elastic range: each rendezvous round decides how many nodes run and which one "
            "this is, so there is no fixed plan to show. Give the node count of one round (--nnodes N), or let the "
            f"launcher show this node's part: `ddpboot --dry-run --nnodes {text} --rdzv-backend c10d "
            "--rdzv-endpoint HOST:PORT ...`."
        )
    return low


def elastic_setup(
    min_nodes: int, max_nodes: int, endpoint: str, store_addr: str, notes: tuple[str, ...] = ()
) -> NodeSetup:
    """An elastic range: planned as node 0 of MAX nodes until a rendezvous round gives the real values."""
    return NodeSetup(max_nodes, 0, store_addr, None, NodeSource.ELASTIC, notes, min_nodes, max_nodes, endpoint)


def cluster_info(setup: NodeSetup) -> dict[str, object]:
    """What `ddpboot plan` shows (and prints in its JSON as `cluster`) about where the node setup came from."""
    info: dict[str, object] = {"source": setup.source.value, "nnodes": setup.nnodes, "node_rank": setup.node_rank,
                               "description": setup.describe()}
    if setup.elastic:
        info.update(min_nodes=setup.min_nodes, max_nodes=setup.max_nodes, rdzv_endpoint=setup.rdzv_endpoint,
                    store_addr=setup.master_addr)
    elif setup.source is not NodeSource.SINGLE:
        info["master_addr"] = setup.master_addr
        info["master_port"] = setup.master_port
    if setup.notes:
        info["notes"] = list(setup.notes)
    return info


def parse_endpoint(text: str, option: str = "--rdzv-endpoint") -> tuple[str, int | None]:
    """`host:port`, `host`, `[::1]:port` → (host, port or None)."""
    t = text.strip()
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", t) or re.fullmatch(r"([^:]*)(?::(\d+))?", t)
    if not m:
        raise UsageError(f"{option} {text!r} is not HOST:PORT.")
    port = int(m.group(2)) if m.group(2) else None
    if port:  # 0 is left to the caller (no port)
        check_port(port, f"{option} {text!r}: port")
    return m.group(1), port
