"""What the launcher and its workers agree on: variable names, isolation modes, stop signals, the exit mark; and
`Choice`, the base of every closed set of words an option or variable takes.

Standard library only: the launcher (no torch) and the worker API (inside the rank) both import it, and neither
may pull the other's layer in through it. Changing a name here changes the public contract (docs/reference.md).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Self

# --- closed sets of words ------------------------------------------------------------------------------------


class Choice(str, Enum):
    """A closed set of words an option or a variable takes (`--isolation rank|node`, `--store python|torch`): each
    member is its word and, optionally, what it means (`about`, said when a word is refused). `values()` is what
    completion offers and help shows (`rank|node`), in order; `parse` reads a word (any case, blanks around)."""

    _value_: str
    about: str

    def __new__(cls, value: str, about: str = "") -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.about = about
        return member

    def __str__(self) -> str:
        return self._value_

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member._value_ for member in cls)

    @classmethod
    def parse(cls, text: str | None, where: str) -> Self:
        """The member `text` names; `cls.error` of a refusal naming `where` (an option or a variable) otherwise."""
        word = cls.normal(text)
        for member in cls:
            if member._value_ == word:
                return member
        raise cls.error(cls.refusal(text, where))

    @classmethod
    def normal(cls, text: str | None) -> str:
        return (text or "").strip().lower()

    @classmethod
    def refusal(cls, text: str | None, where: str) -> str:
        given = f"{where} {text!r}" if where.startswith("-") else f"{where}={text!r}"
        return f"{given}: choose {cls.listing()}."

    @classmethod
    def listing(cls) -> str:
        """`a (what a means), b or c`: the words in order, each with what it means where that is said."""
        words = [f"{m._value_} ({m.about})" if m.about else m._value_ for m in cls]
        return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]

    @classmethod
    def error(cls, message: str) -> Exception:
        """What a refused word raises: ValueError here (the caller says where the word came from); the launcher's
        options raise UsageError (units.OptionChoice)."""
        return ValueError(message)


# --- isolation -----------------------------------------------------------------------------------------------

class Isolation(Choice):
    """How much of the node's GPU selection each worker sees. The one home of what a mode means: the planner, the
    workers' environment, the worker API's guards, smoke and the renderers ask it, never compare strings.

    RANK: each worker sees only its own GPUs (its first is cuda:0) and LOCAL_RANK is 0 (the true index is
    DDPBOOT_LOCAL_RANK). NODE: every worker sees all the node's selected GPUs and the true LOCAL_RANK, its first GPU
    being cuda:LOCAL_RANK*GPUS_PER_RANK (torchrun's semantics)."""

    RANK = "rank", "each worker sees only its own GPUs"
    NODE = "node", "every worker sees all the node's GPUs, as under torchrun"

    @classmethod
    def parse(cls, text: str | None, where: str = "--isolation") -> Self:
        """A mode from its name (any case, spaces ignored); ValueError naming `where` and the choices otherwise."""
        return super().parse(text, where)

    @property
    def own_gpus_only(self) -> bool:
        """Whether a worker's CUDA_VISIBLE_DEVICES lists only its own GPUs."""
        return self is Isolation.RANK

    def visible_devices(self, own: Sequence[str], node: Sequence[str]) -> str:
        """A worker's CUDA_VISIBLE_DEVICES, from its own GPUs and the node's selection (both as CUDA names)."""
        return ",".join(own if self.own_gpus_only else node)

    def first_device(self, local_rank: int, gpus_per_rank: int) -> int:
        """The CUDA ordinal, inside the worker, of the worker's first GPU."""
        return 0 if self.own_gpus_only else local_rank * gpus_per_rank

    def exported_local_rank(self, local_rank: int) -> int:
        """The LOCAL_RANK a worker is given (0 under rank isolation, so that `set_device(LOCAL_RANK)` works)."""
        return 0 if self.own_gpus_only else local_rank


# --- the variables ddpboot adds to torchrun's contract ----------------------------------------------------------

LOCAL_RANK_VAR = "DDPBOOT_LOCAL_RANK"
"""The true node-local index (LOCAL_RANK is 0 under rank isolation)."""
GPU_UUIDS_VAR = "DDPBOOT_GPU_UUIDS"
"""Comma list of this rank's physical GPU UUIDs; empty for a CPU rank."""
ISOLATION_VAR = "DDPBOOT_ISOLATION"
"""The isolation mode the launcher used; its presence also says that ddpboot's launcher started the process."""
FAKE_GPUS_VAR = "DDPBOOT_FAKE_GPUS"
"""A simulated GPU inventory: a count, or a path to a JSON list of GPU records."""
ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"
"""Where torch's `@record` writes a rank's traceback; the exit mark lies beside it."""

# --- signals ---------------------------------------------------------------------------------------------------

STOP_SIGNALS: frozenset[signal.Signals] = frozenset(
    {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
)
"""Signals that stop a job when the launcher receives them (and are forwarded to the workers first)."""
HELPER_IGNORED_SIGNALS: tuple[signal.Signals, ...] = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2
)
"""Ignored by the launcher's own helper processes (the guardian, the node link): a scheduler that signals every
process of a job step (slurmstepd: the time limit's SIGTERM, `--signal=USR1@90`) reaches them too, and what a signal
means for the job is the launcher's to decide; they end when the launcher tells them or dies."""
STACKS_SIGNAL: signal.Signals = signal.SIGUSR2
"""Sent to the launcher, it dumps every rank's current Python stack (into the log and the run directory) and the
job goes on; it is not forwarded to the ranks unless the signals option lists it. The dump ends with a line that
starts with STACKS_END_LINE. (SIGUSR1 stays forwarded: Lightning's SLURM requeue uses it.)"""
STACKS_END_LINE = "ddpboot: stacks: end"
"""The first words of the last line of every stack dump the launcher prints (a caller that sent STACKS_SIGNAL waits
for it)."""
RANK_STACKS_SIGNAL: int = signal.SIGRTMIN + 3
"""The signal on which a rank's `faulthandler` writes every thread's Python stack (registered before the script's
first line by the rank bootstrap of every exec'd Python rank and by the fast-start process, and by `ddpboot.init()`):
the fallback when py-spy is missing or not permitted. A real-time signal nobody else uses; the launcher sends it
only to a rank whose /proc status shows it caught."""
STACKS_VAR = "DDPBOOT_STACKS"
"""`SIGNO:PATH`: where a rank's faulthandler appends its stacks on signal SIGNO (RANK_STACKS_SIGNAL), set by the
launcher; read by register_stacks (`ddpboot.init()`) and, in every exec'd or forked Python rank, by
launch/pymain.py, which writes the parsing again (it imports nothing of ddpboot)."""


def stacks_spec(signo: int, path: str) -> str:
    return f"{signo}:{path}"


def register_stacks(value: str | None) -> bool:
    """Register faulthandler as STACKS_VAR's value asks (every thread's stack, appended to PATH on SIGNO); whether
    it did. The file stays open for the life of the process (faulthandler writes from a signal handler)."""
    signo, _, path = (value or "").partition(":")
    if not signo.isdigit() or not path:
        return False
    import faulthandler

    try:
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- faulthandler keeps it for the process's life
        faulthandler.register(int(signo), file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False
    _KEEP.append(f)
    return True


_KEEP: list[object] = []

# --- the exit mark ---------------------------------------------------------------------------------------------


def exit_mark(error_file: str) -> Path:
    """Where a rank that called `ddpboot.init()` notes the time it began to exit with a failure: beside its
    TORCHELASTIC_ERROR_FILE. The supervisor reads it to tell the rank that failed first (the root cause) from a
    rank that merely died of its peer's leaving."""
    return Path(error_file + ".exiting")


def phases_file(error_file: str) -> Path:
    """Where a Python rank's bootstrap appends the marks of its start-up (launch/pymain.py record_phases, which
    writes the suffix again): beside its TORCHELASTIC_ERROR_FILE."""
    return Path(error_file + ".phases")


def nccl_init_file(error_file: str) -> Path:
    """Where NCCL writes its init log (NCCL_DEBUG_FILE, with --log-dir, for a GPU rank whose user set no NCCL_DEBUG):
    beside its TORCHELASTIC_ERROR_FILE. The start-up waterfall reads NCCL's own init time from it."""
    return Path(error_file + ".nccl")


def stacks_file(error_file: str) -> Path:
    """Where a rank's faulthandler appends its stacks (STACKS_VAR): beside its TORCHELASTIC_ERROR_FILE."""
    return Path(error_file.removesuffix(".error.json") + ".stacks")


# --- ports -----------------------------------------------------------------------------------------------------

TORCHRUN_MASTER_PORT = 29500
"""torchrun's MASTER_PORT for a job of several nodes where nothing else names one: the launcher's default there,
and a rank's where its scheduler gives no job id to derive one from (cluster/base.py `store_port`)."""


def is_tcp_port(port: int) -> bool:
    """A port peers can connect to: 1..65535 (0 means "any free port" to bind, which nobody can connect to)."""
    return 0 < port < 65536
