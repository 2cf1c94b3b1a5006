"""What to launch: the entry point, how output is routed, and how the job is supervised. Plain data.

The CLI (cli/run.py) builds a LaunchSpec from options; the supervisor turns it and the Plan into processes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Literal

from ddpboot.launch.options import Std

TargetKind = Literal["script", "module", "binary", "run_path"]
StoreBackend = Literal["python", "torch"]


@dataclass(frozen=True)
class Target:
    """The program every worker runs: `python -u SCRIPT ARGS`, `python -u -m MODULE ARGS`, a binary (`--no-python`),
    or a script run through `runpy.run_path` (`--run-path`)."""

    kind: TargetKind
    name: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Routing:
    """Where each local rank's stdout/stderr go. `files[r]`: streams written to the rank's log file;
    `console[r]`: streams shown on the launcher's console (after the rank filters)."""

    files: dict[int, Std] = field(default_factory=dict)
    console: dict[int, Std] = field(default_factory=dict)
    prefix: bool = True

    def to_file(self, local_rank: int, stream: Std) -> bool:
        return bool(self.files.get(local_rank, Std.NONE) & stream)

    def to_console(self, local_rank: int, stream: Std) -> bool:
        return bool(self.console.get(local_rank, Std.ALL) & stream)


@dataclass(frozen=True)
class LaunchSpec:
    target: Target
    python: str  # the interpreter for script, module and run_path targets (PYTHON_EXEC or the launcher's own)
    run_id: str
    role: str = "default"
    max_restarts: int = 0
    shutdown_timeout: float = 30.0
    monitor_interval: float = 0.1
    routing: Routing = field(default_factory=Routing)
    signals: tuple[signal.Signals, ...] = ()
    master_addr: str = "127.0.0.1"  # what workers get as MASTER_ADDR
    bind_addr: str = "127.0.0.1"  # where the store listens
    master_port: int | None = None  # None: any free port (bound by the launcher, so no race)
    store: StoreBackend = "python"
