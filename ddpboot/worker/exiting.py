"""What init() registers to run at interpreter exit: the exit mark for ddpboot's launcher, then shutdown()."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch.distributed as dist

from ddpboot.contract import ERROR_FILE_VAR, LOCAL_RANK_VAR, exit_mark
from ddpboot.worker.context import shutdown

_PEER_GONE = ("/gloo/", "Connection closed by peer", "Connection reset by peer", "NCCL")
"""Text of the errors gloo and NCCL raise in a collective whose peer went away."""


def shutdown_at_exit() -> None:
    """shutdown() at interpreter exit, announced first. Destroying the process group while another rank still waits
    in a collective makes that rank fail at once, often before this process has finished exiting; the mark (written
    before anything is torn down) tells ddpboot's launcher that this rank was leaving first, so that it waits for
    this rank's own exit code instead of blaming the rank that merely lost its peer."""
    error_file = os.environ.get(ERROR_FILE_VAR)
    if error_file and os.environ.get(LOCAL_RANK_VAR) is not None and not _failed_collective():
        with contextlib.suppress(OSError):
            exit_mark(error_file).write_text(f"{time.time():.6f}\n")
    shutdown()


def _failed_collective() -> bool:
    """Whether the interpreter is exiting because a collective failed (a peer went away): such a rank is not
    leaving of its own accord, so it writes no at-exit mark; the rank whose leaving broke the collective is the root
    cause (it exited first, or marked itself before tearing the group down)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # set for an uncaught exception
    if exc is None:
        return False
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_GONE)
