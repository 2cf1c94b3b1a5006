"""What to launch, as plain data: the entry point (Target), where output goes (Std, Routing, LinePrefix), who may
read the logs (LogMode), who serves the store (StoreBackend), and what every attempt shares (Supervision, LaunchSpec),
with where a supervisor writes (RunDir) and what it watches (Watch). The runner (launch/runner.py) builds the
LaunchSpec from the LaunchConfig and the plan; the supervisor turns it into processes."""

from __future__ import annotations

import os
import signal
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import IntFlag
from pathlib import Path
from typing import Any

from ddpboot.launch.pymain import TargetKind
from ddpboot.selection.affinity import format_cpu_list
from ddpboot.tcpstore.allow import AllowList
from ddpboot.units import OptionChoice


class LogMode(OptionChoice):
    """Who may read a run's directories and log files (`--log-mode`); see the module docstring."""

    PRIVATE = "private", "the run's logs readable by you only, the default"  # directories 0700, files 0600
    SHARED = "shared", "readable as your umask allows"  # 0755 and 0644 under the usual umask 022

    @property
    def dir_mode(self) -> int:
        return 0o700 if self is LogMode.PRIVATE else 0o777

    @property
    def file_mode(self) -> int:
        return 0o600 if self is LogMode.PRIVATE else 0o644

    def make_dir(self, path: Path, exist_ok: bool = False) -> None:
        """Create `path` with this mode (its parents as the umask allows; FileExistsError unless `exist_ok`)."""
        path.mkdir(mode=self.dir_mode, parents=True, exist_ok=exist_ok)
        if self is LogMode.PRIVATE:
            os.chmod(path, self.dir_mode)  # exactly 0700, whatever the umask left


class StoreBackend(OptionChoice):
    """Who serves the workers' store (`--store`): ddpboot's own server, or torch's TCPStore in the guardian."""

    PYTHON = "python", "ddpboot's store, the default"
    TORCH = "torch"


class Std(IntFlag):
    """Which of a worker's streams an option applies to (torchrun's values: 0 none, 1 out, 2 err, 3 both)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


StdSpec = Std | dict[int, Std]


@dataclass(frozen=True)
class Target:
    """The program every worker runs: `python -u SCRIPT ARGS`, `python -u -m MODULE ARGS`, a binary (`--no-python`),
    or a script run through `runpy.run_path` (`--run-path`)."""

    kind: TargetKind
    name: str
    args: tuple[str, ...] = ()


PREFIX_FIELDS = ("rank", "local_rank", "node_rank", "role_name", "hostname")
"""The names a line prefix template may use (`--log-line-prefix-template`): torchrun's four and `node_rank`."""

DEFAULT_PREFIX_TEMPLATE = "[rank${rank}]: "
"""ddpboot's own prefix, `[rank3]: `, by global rank."""


@dataclass(frozen=True)
class LinePrefix:
    """What begins each console line of a rank: a template over PREFIX_FIELDS (checked when parsed, in
    options.parse_prefix_template), with the job's role and this host's name filled in; the ranks' own fields are
    filled in per worker, since an elastic round renumbers them."""

    template: str = DEFAULT_PREFIX_TEMPLATE
    role_name: str = "default"
    hostname: str = ""

    def render(self, rank: int, local_rank: int, node_rank: int) -> bytes:
        text = string.Template(self.template).substitute(
            rank=rank, local_rank=local_rank, node_rank=node_rank, role_name=self.role_name, hostname=self.hostname)
        return text.encode(errors="replace")

    def render_group(self, ranks: Sequence[tuple[int, int, int]]) -> bytes:
        """The prefix of a line several ranks said alike (collapse.py): each field as the list of its values,
        `[rank0-3]: ` from (rank, local_rank, node_rank) of ranks 0 to 3."""
        rank, local_rank, node_rank = (format_cpu_list(sorted(set(values))) for values in zip(*ranks, strict=True))
        text = string.Template(self.template).substitute(
            rank=rank, local_rank=local_rank, node_rank=node_rank, role_name=self.role_name, hostname=self.hostname)
        return text.encode(errors="replace")


@dataclass(frozen=True)
class Routing:
    """Where each local rank's stdout/stderr go. `files[r]`: streams written to the rank's log file;
    `console[r]`: streams shown on the launcher's console (after the rank filters); `prefix`: what begins each
    console line (None: nothing, `--no-prefix`); `collapse`: a line several ranks say alike is shown once, the
    ranks named in its prefix (collapse.py; off with --no-collapse, and without a prefix to name them in)."""

    files: dict[int, Std] = field(default_factory=dict)
    console: dict[int, Std] = field(default_factory=dict)
    prefix: LinePrefix | None = field(default_factory=LinePrefix)
    collapse: bool = True

    def to_file(self, local_rank: int, stream: Std) -> bool:
        return bool(self.files.get(local_rank, Std.NONE) & stream)

    def to_console(self, local_rank: int, stream: Std) -> bool:
        return bool(self.console.get(local_rank, Std.ALL) & stream)

    def line_prefix(self, rank: int, local_rank: int, node_rank: int) -> bytes:
        """The console prefix of one worker (b"" without one)."""
        return b"" if self.prefix is None else self.prefix.render(rank, local_rank, node_rank)

    def group_prefix(self) -> LinePrefix | None:
        """The template that names the ranks of a collapsed line; None: lines are not collapsed."""
        return self.prefix if self.collapse else None


GPU_WATCH_EXIT = 125  # the job's exit code when `--gpu-watch strict` ended it


class WatchMode(OptionChoice):
    """--gpu-watch: what the launcher does about a GPU used wrongly while the job runs (launch/observe/gpuwatch.py)."""

    WARN = "warn", "the default: say what is wrong"
    STRICT = "strict", f"end the job with exit code {GPU_WATCH_EXIT} when a rank uses a GPU that is not its own"
    OFF = "off"


@dataclass(frozen=True)
class Supervision:
    """How every attempt of a job is supervised, as its options decided (launch/config.py `supervision`): the part a
    LaunchConfig and its LaunchSpec share, both being one. No defaults: the command line's are RunOptions'."""

    role: str
    max_restarts: int
    shutdown_timeout: float
    monitor_interval: float
    stall_timeout: float | None  # --stall-timeout: dump the stacks and stop after this long without progress
    gpu_watch: WatchMode
    gpu_watch_interval: float
    signals: tuple[signal.Signals, ...]
    store: StoreBackend
    straggler_window: float  # --straggler-window: seconds a rank must be slower to be named (0: not watched)

    def shared(self) -> dict[str, Any]:
        """These fields by name, for the record that shares them (`LaunchSpec(**config.shared(), ...)`)."""
        return {f.name: getattr(self, f.name) for f in fields(Supervision)}


@dataclass(frozen=True)
class LaunchSpec(Supervision):
    """What the supervisor runs, the same for every attempt (and every elastic round but for the store's address):
    the LaunchConfig's supervision with what the plan and the node setup add (`runner.launch_spec`)."""

    target: Target
    python: str  # the interpreter for script, module and run_path targets (PYTHON_EXEC or the launcher's own)
    run_id: str
    routing: Routing
    master_addr: str  # what workers get as MASTER_ADDR
    bind_addr: str  # where the store listens
    master_port: int | None  # None: any free port (bound by the launcher, so no race)
    store_allow: AllowList | None  # the addresses the store serves (None: every address; tcpstore/allow.py)
    log_dir: Path | None  # --log-dir: the job's logs under DIR/RUN_ID; None: a temporary directory
    log_mode: LogMode  # who may read the run directory and its files


@dataclass(frozen=True)
class RunDir:
    """Where one supervisor's attempts write: the run's log directory, or a temporary one (error files, exit marks
    and stack dumps only) that is removed at the end."""

    path: Path
    temporary: bool


@dataclass(frozen=True)
class EndJob:
    """A watch's answer that ends the job (another node failed): `text` is said, every rank gets SIGTERM, and the
    attempt's exit code is `code`."""

    code: int
    text: str


@dataclass(frozen=True)
class Watch:
    """Asked every `interval` seconds while the workers run: a reason (not None) stops the attempt, which is
    recorded as a restart reason (an elastic job's membership change), or an EndJob. `failed` is given the
    attempt's root-cause worker as soon as it is chosen (the node link tells the other nodes)."""

    check: Callable[[], str | EndJob | None]
    interval: float = 1.0
    failed: Callable[[Any], None] | None = None
