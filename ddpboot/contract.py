"""What the launcher and its workers agree on: variable names, isolation modes, stop signals, the exit mark.

Standard library only: the launcher (no torch) and the worker API (inside the rank) both import it, and neither
may pull the other's layer in through it. Changing a name here changes the public contract (docs/reference.md).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Literal

# --- isolation -----------------------------------------------------------------------------------------------

Isolation = Literal["rank", "node"]
ISOLATIONS: tuple[Isolation, ...] = ("rank", "node")
"""`rank`: each worker sees only its own GPUs (as cuda:0) and LOCAL_RANK is 0; `node`: every worker sees all the
node's selected GPUs and the true LOCAL_RANK (torchrun's semantics)."""

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
STACKS_SIGNAL: signal.Signals = signal.SIGUSR2
"""Sent to the launcher, it dumps every rank's current Python stack (into the log and the run directory) and the
job goes on; it is not forwarded to the ranks unless the signals option lists it. The dump ends with a line that
starts with STACKS_END_LINE. (SIGUSR1 stays forwarded: Lightning's SLURM requeue uses it.)"""
STACKS_END_LINE = "ddpboot: stacks: end"
"""The first words of the last line of every stack dump the launcher prints (a caller that sent STACKS_SIGNAL waits
for it)."""
RANK_STACKS_SIGNAL: int = signal.SIGRTMIN + 3
"""The signal on which a rank's `faulthandler` writes every thread's Python stack (registered by `ddpboot.init()`
and by the fast-start process in each rank): the fallback when py-spy is missing or not permitted. A real-time
signal nobody else uses; the launcher sends it only to a rank whose /proc status shows it caught."""
STACKS_VAR = "DDPBOOT_STACKS"
"""`SIGNO:PATH`: where a rank's faulthandler appends its stacks on signal SIGNO (RANK_STACKS_SIGNAL), set by the
launcher; read by `ddpboot.init()` and by the fast-start process (which writes the parsing again: it imports
nothing of ddpboot)."""


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


def stacks_file(error_file: str) -> Path:
    """Where a rank's faulthandler appends its stacks (STACKS_VAR): beside its TORCHELASTIC_ERROR_FILE."""
    return Path(error_file.removesuffix(".error.json") + ".stacks")


# --- ports -----------------------------------------------------------------------------------------------------


def is_tcp_port(port: int) -> bool:
    """A port peers can connect to: 1..65535 (0 means "any free port" to bind, which nobody can connect to)."""
    return 0 < port < 65536
