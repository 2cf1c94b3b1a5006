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

# --- the exit mark ---------------------------------------------------------------------------------------------


def exit_mark(error_file: str) -> Path:
    """Where a rank that called `ddpboot.init()` notes the time it began to exit with a failure: beside its
    TORCHELASTIC_ERROR_FILE. The supervisor reads it to tell the rank that failed first (the root cause) from a
    rank that merely died of its peer's leaving."""
    return Path(error_file + ".exiting")


# --- ports -----------------------------------------------------------------------------------------------------


def is_tcp_port(port: int) -> bool:
    """A port peers can connect to: 1..65535 (0 means "any free port" to bind, which nobody can connect to)."""
    return 0 < port < 65536
