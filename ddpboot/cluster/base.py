"""The interface every cluster environment implements, and the checked readers they share.

A cluster environment answers "who am I in this job?" (ranks, sizes, where the rendezvous store is) from the
variables some launcher left in the environment. Each implementation is a pure function of the mapping it is given:
it never reads `os.environ` itself, so tests can feed it any environment and two environments can be compared side
by side. Everything is read and checked in the constructor, so a bad variable fails at startup, naming itself,
instead of half-way through `init_process_group`.
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Generic, TypeVar, cast, overload

from ddpboot.contract import TORCHRUN_MASTER_PORT, Isolation
from ddpboot.errors import WorkerEnvError

PORT_BASE = 15000
PORT_SPAN = 17000
"""Derived ports lie in 15000..31999: above the well-known and common service ports, below Linux's default
ephemeral range (32768..60999), so a derived port never collides with the local port of an outgoing connection."""

LOOPBACK = "127.0.0.1"
T = TypeVar("T")


class Given(Generic[T]):
    """One of the values a cluster environment provides, as a read-only attribute: what its constructor set as the
    attribute `attr`."""

    def __init__(self, attr: str, doc: str) -> None:
        self.attr = attr
        self.__doc__ = doc

    @overload
    def __get__(self, env: None, owner: type) -> Given[T]: ...
    @overload
    def __get__(self, env: object, owner: type) -> T: ...
    def __get__(self, env: object | None, owner: type) -> Given[T] | T:
        return self if env is None else cast(T, getattr(env, self.attr))

    def __set__(self, env: object, value: T) -> None:
        raise AttributeError(f"{self.attr[1:]} is read-only: the environment's constructor sets {self.attr}")


class ClusterEnvironment(abc.ABC):
    """Where this process's ranks, sizes and rendezvous address come from (torchrun variables, SLURM, ...).

    Adding a source is one new subclass: a `detect` that says whether its launcher started this process, and a
    constructor that reads and checks the eight values below (`self._world_size`, ...). A built-in one is listed in
    `ddpboot.cluster.ENVIRONMENTS`; one from another package is declared as an entry point of the group
    `ddpboot.environments` (`ddpboot.cluster.plugins`), or handed to `ddpboot.init(environment=...)`. The class
    attributes and the accessors after them tell the worker API (`ddpboot.init()`) how to join the job; their
    defaults fit a launcher that gives no torchrun variables, lets each process see the node's GPUs and uses GPU
    number `local_rank`.
    """

    name: ClassVar[str]
    """Which launcher this is, as `ddpboot.Context.launcher` reports it."""

    local_rank_var: ClassVar[str] = "LOCAL_RANK"
    """The variable that says which visible GPU is this process's; the worker's messages name it."""

    exports_contract: ClassVar[bool] = True
    """Whether the worker must export torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, ...) itself before it
    joins with `init_method="env://"`: true unless the launcher already set them."""

    joins_group: ClassVar[bool] = True
    """Whether the process joins a process group; false only for a single process that no launcher started."""

    narrows_visible_devices: ClassVar[bool] = False
    """Whether a process may see every GPU of its node and must narrow CUDA_VISIBLE_DEVICES to its own one before
    CUDA starts (`own_visible_devices` says to what)."""

    task_noun: ClassVar[str] = "process"
    """What the worker's messages call one process of this launcher."""

    @classmethod
    @abc.abstractmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """Whether `env` looks like a process started by this environment's launcher. Cheap; never raises."""

    @abc.abstractmethod
    def __init__(self, env: Mapping[str, str]) -> None:
        """Read and check every value from `env`; raise `WorkerEnvError` naming the variable that is wrong."""

    # The eight values every environment provides, read-only: a subclass's constructor checks each and sets it as
    # the attribute named (`self._world_size = ...`).
    _world_size: int
    _rank: int
    _local_rank: int
    _local_world_size: int
    _node_rank: int
    _nnodes: int
    _main_address: str
    _main_port: int
    world_size = Given[int]("_world_size", "Number of processes in the job.")
    global_rank = Given[int]("_rank", "This process's rank in the job, 0 .. world_size-1.")
    local_rank = Given[int]("_local_rank", "This process's true index among the processes of its node, 0 .. "
                            "local_world_size-1.")
    local_world_size = Given[int]("_local_world_size", "Number of processes on this node.")
    node_rank = Given[int]("_node_rank", "This node's index in the job, 0 .. nnodes-1.")
    nnodes = Given[int]("_nnodes", "Number of nodes in the job.")
    main_address = Given[str]("_main_address", "Host of the rendezvous store (MASTER_ADDR).")
    main_port = Given[int]("_main_port", "Port of the rendezvous store (MASTER_PORT).")

    @property
    def device_index(self) -> int:
        """Which of the GPUs this process sees is its own (LOCAL_RANK's meaning); by default its local rank."""
        return self._local_rank

    @property
    def isolation(self) -> Isolation | None:
        """How ddpboot's launcher isolated this process's GPUs; None for launchers that do not."""
        return None

    @property
    def assigned_gpus(self) -> tuple[str, ...]:
        """UUIDs of the GPUs the launcher assigned to this process; empty when it does not say."""
        return ()

    def own_visible_devices(self, entries: Sequence[str] | None, visible_count: int) -> str | None:
        """The CUDA_VISIBLE_DEVICES value that leaves this process only its own GPU, or None to leave the variable
        alone. `entries`: the variable's entries (None when unset); `visible_count`: how many GPUs it shows.
        Asked only when `narrows_visible_devices` is true."""
        del entries, visible_count
        return None

    @property
    def placed_by_hosts(self) -> bool:
        """Whether the node rank and count are only an estimate (the launcher gives no node index): init() then
        asks every rank's host once the process group exists and calls `place` (cluster/placement.py)."""
        return False

    def place(self, node_rank: int, nnodes: int) -> None:
        """The node rank and count found from where the ranks run."""
        self._node_rank, self._nnodes = node_rank, nnodes

    @property
    def notes(self) -> tuple[str, ...]:
        """Assumptions this environment made that the user should hear about (`ddpboot.init()` warns with each)."""
        return ()

    def describe(self) -> str:
        """One line for logs and `ddpboot plan`."""
        return (
            f"{self.name}: rank {self.global_rank}/{self.world_size}, local rank "
            f"{self.local_rank}/{self.local_world_size}, node {self.node_rank}/{self.nnodes}, "
            f"store {self.main_address}:{self.main_port}"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class TaskEnvironment(ClusterEnvironment):
    """A launcher that starts one process (a task) per rank and may let each see every GPU of its node (mpirun,
    jsrun, pbsdsh, srun): the task of local rank i then takes the i-th (`one_gpu_each`)."""

    narrows_visible_devices: ClassVar[bool] = True
    started_by: ClassVar[str]
    """The launcher's command, as the worker's messages name it."""

    def __init_subclass__(cls, *, name: str, local_rank_var: str, task_noun: str, started_by: str,
                          **kwargs: object) -> None:
        """Each such launcher says on its class line what the worker's messages call it: its environment's name,
        what gives the local rank, a task, and the command that starts the tasks
        (`class MpiEnvironment(TaskEnvironment, name="mpi", ...)`)."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.local_rank_var, cls.task_noun, cls.started_by = name, local_rank_var, task_noun, started_by

    @abc.abstractmethod
    def fewer_tasks(self, visible_count: int) -> str:
        """How to start no more tasks on a node than the `visible_count` GPUs each of them sees."""

    def own_visible_devices(self, entries: Sequence[str] | None, visible_count: int) -> str | None:
        return one_gpu_each(entries, visible_count, self._local_rank, self._local_world_size, self.started_by,
                            self.fewer_tasks(visible_count))


def first_set(env: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    """The first of `names` that is set to a non-empty value, as (name, value); None if none is.

    SLURM spells several values twice (SLURM_STEP_NUM_TASKS / SLURM_NTASKS, SLURM_STEP_ID / SLURM_STEPID) and an
    empty variable is how job scripts commonly "unset" one, so empty counts as unset.
    """
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def require(env: Mapping[str, str], names: str | Sequence[str], context: str) -> tuple[str, str]:
    """(name, value) of the first of `names` that is set; WorkerEnvError naming all of them otherwise.

    `context` says why the variable was expected (which launcher was detected) and what to do.
    """
    candidates = [names] if isinstance(names, str) else list(names)
    found = first_set(env, candidates)
    if found is None:
        which = candidates[0] if len(candidates) == 1 else " or ".join(candidates)
        raise WorkerEnvError(f"{which} is not set. {context}")
    return found


def read_int(env: Mapping[str, str], names: str | Sequence[str], context: str, *, minimum: int = 0) -> tuple[str, int]:
    """(name, value) of the first of `names` that is set, parsed as an integer >= `minimum`."""
    name, raw = require(env, names, context)
    return name, parse_int(name, raw, minimum=minimum)


def parse_int(name: str, raw: str, *, minimum: int = 0) -> int:
    """`raw` (the value of variable `name`) as an integer >= `minimum`; WorkerEnvError naming `name` otherwise."""
    text = raw.strip()
    if not text.isdecimal() or not text.isascii():
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise WorkerEnvError(f"{name}={raw!r} is not {kind}.")
    value = int(text)
    if value < minimum:
        raise WorkerEnvError(f"{name}={raw!r} must be at least {minimum}.")
    return value


def parse_port(name: str, raw: str) -> int:
    """A TCP port from variable `name`: 1..65535 (0 would mean "any port", which peers cannot connect to)."""
    port = parse_int(name, raw, minimum=1)
    if port > 65535:
        raise WorkerEnvError(f"{name}={raw!r} is not a TCP port (1..65535).")
    return port


def check_below(name: str, value: int, bound_name: str, bound: int) -> None:
    """Raise WorkerEnvError unless value < bound, e.g. RANK < WORLD_SIZE; both variables are named."""
    if value >= bound:
        raise WorkerEnvError(
            f"{name}={value} is not below {bound_name}={bound}: the launcher's variables contradict each other "
            f"({name} counts from 0 and must be less than {bound_name})."
        )


def check_at_most(name: str, value: int, bound_name: str, bound: int) -> None:
    """Raise WorkerEnvError unless value <= bound, e.g. LOCAL_WORLD_SIZE <= WORLD_SIZE."""
    if value > bound:
        raise WorkerEnvError(
            f"{name}={value} is larger than {bound_name}={bound}: the launcher's variables contradict each other."
        )


def store_port(env: Mapping[str, str], derive: Callable[[], int | None]) -> int:
    """The store's port, as every task of a job finds it alike: MASTER_PORT when set (schedulers pass it on to every
    task), else the port `derive` computes from what the scheduler gives every task (a job id: `job_port_of`), else
    torchrun's TORCHRUN_MASTER_PORT."""
    explicit = first_set(env, ["MASTER_PORT"])
    if explicit is not None:
        return parse_port(*explicit)
    derived = derive()
    return TORCHRUN_MASTER_PORT if derived is None else derived


def job_port(key: str) -> int:
    """The store port every process of one job derives alike from `key`, a value the launcher gives all of them (a
    job id, a PMIx namespace) when MASTER_PORT is not set: PORT_BASE + crc32(key) mod PORT_SPAN."""
    return PORT_BASE + zlib.crc32(key.encode()) % PORT_SPAN


def job_port_of(env: Mapping[str, str], names: Sequence[str], step: str = "") -> int | None:
    """job_port of `NAME=VALUE` (and ` step`, what one step of the job runs), the first of `names` that is set;
    None when none is."""
    found = first_set(env, names)
    if found is None:
        return None
    key = f"{found[0]}={found[1]}"
    return job_port(f"{key} {step}" if step else key)


def one_gpu_each(
    entries: Sequence[str] | None, visible_count: int, local_rank: int, local_world_size: int, started_by: str, fix: str
) -> str | None:
    """CUDA_VISIBLE_DEVICES for process `local_rank` of `local_world_size` on a node whose GPUs it all sees: entry
    `local_rank` of the list (index `local_rank` when the variable is unset); None when it sees one GPU or none (its
    launcher chose already). Raises WorkerEnvError when the node's processes cannot have one GPU each."""
    if visible_count < 2:
        return None
    if visible_count < local_world_size:
        raise WorkerEnvError(
            f"{started_by} started {local_world_size} tasks on this node but this task sees {visible_count} GPUs, so "
            f"they cannot have one GPU each (NCCL refuses two ranks on one GPU). Fix: {fix}"
        )
    if entries is None:
        return str(local_rank)
    return entries[local_rank]


def store_host(env: Mapping[str, str], one_host: bool, context: str) -> str:
    """MASTER_ADDR when set; loopback when every process of the job runs on this host; else WorkerEnvError.

    For launchers whose variables do not name the host of rank 0 (MPI, jsrun): only rank 0 can know it, and asking
    it needs a channel between the ranks that exists only once they have met. `context` says what to set, how."""
    found = first_set(env, ["MASTER_ADDR"])
    if found is not None:
        return found[1]
    if one_host:
        return LOOPBACK
    raise WorkerEnvError(f"MASTER_ADDR is not set, and the ranks of this job run on several hosts. {context}")


def read_ranks(
    env: Mapping[str, str], rank: Sequence[str], size: Sequence[str], local_rank: Sequence[str],
    local_size: Sequence[str], context: str,
) -> tuple[int, int, int, int]:
    """(rank, size, local rank, local size) from the first set variable of each list, checked against each other:
    rank < size, local size <= size, local rank < local size. For launchers that give all four (MPI, jsrun)."""
    size_var, world = read_int(env, size, context, minimum=1)
    rank_var, me = read_int(env, rank, context)
    check_below(rank_var, me, size_var, world)
    local_size_var, local_world = read_int(env, local_size, context, minimum=1)
    check_at_most(local_size_var, local_world, size_var, world)
    local_var, local = read_int(env, local_rank, context)
    check_below(local_var, local, local_size_var, local_world)
    return me, world, local, local_world
