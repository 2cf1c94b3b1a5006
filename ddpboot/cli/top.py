"""`ddpboot top`'s table: one row per rank of a running job, from its launcher's status file (observe/status.py) and
readings of the ranks' processes (/proc) and GPUs (NVML, or DDPBOOT_FAKE_GPUS).

`build_rows` is pure (a status, process readings, GPU readings and the time in, rows out) and `render` turns rows
into what rich shows; the readers (`read_process`, `GpuReader`) are thin.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpboot.cli.output import escape
from ddpboot.cli.render import Column, fit_columns
from ddpboot.procfs import read_stat

MIN_PROGRESS = 16  # the progress column's least width; the other columns give way to it below this


@dataclass(frozen=True)
class ProcReading:
    """One look at a process: its CPU seconds (user + system, every thread), resident memory and state letter."""

    cpu: float
    rss: int
    state: str


def read_process(pid: int, start: int | None = None) -> ProcReading | None:
    """From /proc/PID/stat; None when gone, not started (pid 0), or not the process that started at `start`."""
    stat = read_stat(pid)
    if stat is None or (start is not None and stat.start != start):
        return None
    return ProcReading(stat.cpu, stat.rss, stat.state)


@dataclass(frozen=True)
class GpuUse:
    """One GPU of a rank: the rank's processes' memory on it, and the whole GPU's memory and utilisation."""

    label: str
    uuid: str
    used: int | None = None  # bytes the rank's processes hold on it (None: unknown)
    memory_used: int | None = None
    memory_total: int | None = None
    utilization: int | None = None

    def cell(self) -> str:
        util = "" if self.utilization is None else f" {self.utilization}%"
        return f"{self.label} {_short(self.used)}{util}"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "uuid": self.uuid, "used_memory": self.used, "memory_used": self.memory_used,
                "memory_total": self.memory_total, "utilization": self.utilization}


@dataclass(frozen=True)
class Row:
    rank: int
    local_rank: int
    node: int
    pid: int
    state: str
    cpu: float | None  # percent of one core
    rss: int | None
    gpus: tuple[GpuUse, ...] = ()
    quiet: float | None = None  # seconds since its last output (None: no output yet)
    bar: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "node": self.node, "pid": self.pid,
                "state": self.state, "cpu_percent": None if self.cpu is None else round(self.cpu, 1),
                "rss": self.rss, "gpus": [g.to_json() for g in self.gpus],
                "since_output": None if self.quiet is None else round(self.quiet, 1), "progress": self.bar}


@dataclass(frozen=True)
class GpuReadings:
    """The machine's GPUs by UUID (memory used, total, utilisation) and which bytes each pid holds where."""

    gpus: Mapping[str, tuple[int | None, int | None, int | None]] = field(default_factory=dict)
    held: Mapping[tuple[int, str], int] = field(default_factory=dict)  # (rank, uuid) → bytes of its processes
    known: bool = False  # False: not read (no GPU in the job, or NVML failed)


def _short(n: int | None) -> str:
    """Memory in a few characters: 512M, 1.5G, 80G."""
    if n is None:
        return "?"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{n}B"


def state_of(entry: Mapping[str, Any], proc: ProcReading | None) -> str:
    """What can be known from outside the launcher: not started, reaped with a code, gone, stopped or running."""
    if not entry.get("pid"):
        return "starting"
    if entry.get("code") is not None:
        return f"exited {entry['code']}"
    if proc is None or proc.state in ("Z", "X"):
        return "exited"
    if proc.state in ("T", "t"):
        return "stopped"
    return "running"


def cpu_percent(before: ProcReading | None, now: ProcReading | None, elapsed: float) -> float | None:
    if before is None or now is None or elapsed <= 0:
        return None
    return max(now.cpu - before.cpu, 0.0) / elapsed * 100


def build_rows(status: Mapping[str, Any], before: Mapping[int, ProcReading | None],
               now: Mapping[int, ProcReading | None], elapsed: float, gpus: GpuReadings, wall: float) -> list[Row]:
    """The table's rows: the status's ranks, with the process readings (by pid, `elapsed` seconds apart) and the
    GPU readings, at unix time `wall`."""
    rows = []
    for entry in status.get("ranks", []):
        pid = int(entry.get("pid") or 0)
        proc = now.get(pid)
        state = state_of(entry, proc)
        alive = state in ("running", "stopped")
        uses = []
        for g in entry.get("gpus", []):
            used, total, util = gpus.gpus.get(g["uuid"], (None, None, None))
            held = gpus.held.get((entry["rank"], g["uuid"]), 0 if gpus.known and alive else None)
            uses.append(GpuUse(g["label"], g["uuid"], held, used, total, util))
        last = entry.get("last_output")
        rows.append(Row(
            rank=int(entry["rank"]), local_rank=int(entry.get("local_rank", 0)), node=int(status.get("node_rank", 0)),
            pid=pid, state=state, cpu=cpu_percent(before.get(pid), proc, elapsed) if alive else None,
            rss=proc.rss if alive and proc is not None else None, gpus=tuple(uses),
            quiet=max(wall - float(last), 0.0) if last is not None else None, bar=entry.get("bar"),
        ))
    return rows


def snapshot_json(status: Mapping[str, Any], rows: list[Row], wall: float) -> dict[str, Any]:
    """`ddpboot top --json`: the job and its rows (docs/reference.md)."""
    updated = status.get("updated")
    return {"run_id": status.get("run_id"), "launcher_pid": status.get("pid"), "host": status.get("host"),
            "node_rank": status.get("node_rank"), "attempt": status.get("attempt"),
            "world_size": status.get("world_size"),
            "status_age": None if updated is None else round(max(wall - float(updated), 0.0), 1),
            "ranks": [r.to_json() for r in rows], "warnings": list(status.get("warnings", []))}


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.0f}s"
    return f"{s / 60:.0f}m" if s < 3600 else f"{s / 3600:.0f}h"


def _state_cell(state: str) -> str:
    if state.startswith("exited") and state != "exited 0":
        return f"[red]{state}[/]"
    return f"[yellow]{state}[/]" if state in ("starting", "stopped") else state


def compact_bar(text: str) -> str:
    """A progress bar as the table shows it: without its drawn part (tqdm's `|####  |`), which a narrow column
    would cut first, so the count, the times and the rate stay."""
    return " ".join(re.sub(r"\|[^|]*\|", " ", text).split())


def columns(rows: list[Row]) -> list[Column]:
    """Every column but the progress bar's, which takes what the others leave (`render`). The GPU column only
    when a rank has a GPU."""
    cols = [
        Column("rank", [str(r.rank) for r in rows], keep=True),
        Column("node", [str(r.node) for r in rows]),
        Column("pid", [str(r.pid or "-") for r in rows]),
        Column("state", [_state_cell(r.state) for r in rows], keep=True),
        Column("CPU", ["-" if r.cpu is None else f"{r.cpu:.0f}%" for r in rows]),
        Column("RSS", [_short(r.rss) if r.rss is not None else "-" for r in rows]),
        Column("GPU", [", ".join(g.cell() for g in r.gpus) or "-" for r in rows]),
        Column("quiet", [_seconds(r.quiet) for r in rows]),
    ]
    return cols if any(r.gpus for r in rows) else [c for c in cols if c.header != "GPU"]


PRIORITY = ["pid", "quiet", "CPU", "RSS", "GPU", "node"]  # the order columns are kept in as the width shrinks


def head_lines(status: Mapping[str, Any], width: int) -> str:
    """The job's line(s): parts joined by ` · `, a line breaking between parts, never inside one."""
    ranks = len(status.get("ranks", []))
    parts = [f"[bold]run {escape(str(status.get('run_id', '?')))}[/]", f"launcher pid {status.get('pid', '?')}",
             f"node {status.get('node_rank', 0)} ({escape(str(status.get('host', '?')))})",
             f"{ranks} of {status.get('world_size', ranks)} ranks here", f"attempt {status.get('attempt', 0)}"]
    lines = [parts[0]]
    for part in parts[1:]:
        if _cells(lines[-1]) + 3 + _cells(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return "\n".join(lines)


def _cells(markup: str) -> int:
    from rich.text import Text

    return Text.from_markup(markup).cell_len


def render(status: Mapping[str, Any], rows: list[Row], width: int, footer: str = "") -> Any:
    """The screen: the job's line, the table (one line per rank, at most `width` columns: the progress bar gets
    what the other columns leave), the GPU watch's warnings, and `footer`."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    cols = columns(rows)
    shown = fit_columns(cols, width - MIN_PROGRESS - 3, [h for h in PRIORITY if any(c.header == h for c in cols)])
    room = max(width - 1 - sum(c.width() + 3 for c in shown), 8)
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for col in shown:
        table.add_column(col.header, no_wrap=True, min_width=col.width())
    table.add_column("progress", no_wrap=True, overflow="ellipsis", max_width=room)
    for i, row in enumerate(rows):
        bar = Text(compact_bar(row.bar) if row.bar else "-", no_wrap=True, overflow="ellipsis")
        table.add_row(*(col.cells[i] for col in shown), bar)
    parts: list[Any] = [Text.from_markup(head_lines(status, width)), table]
    parts += [Text(warning, style="yellow") for warning in status.get("warnings", [])]
    if footer:
        parts.append(Text.from_markup(f"[dim]{footer}[/]"))
    return Group(*parts)


class GpuReader:
    """The GPUs' memory and utilisation and their processes, read the way the GPU watch reads them: the simulated
    inventory when DDPBOOT_FAKE_GPUS is set, else NVML (one session for the processes, kept open)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.reader: Any = None  # selection.activity.GpuReader, made at the first reading
        self.failed: str | None = None

    def read(self, status: Mapping[str, Any]) -> GpuReadings:
        from ddpboot.launch.observe.gpuwatch import RankGpus, owners
        from ddpboot.launch.procs import leftovers
        from ddpboot.selection.activity import GpuReader
        from ddpboot.selection.inventory import load_inventory

        ranks = [RankGpus(int(e["rank"]), int(e["pid"]), frozenset(g["uuid"] for g in e.get("gpus", [])), "")
                 for e in status.get("ranks", []) if e.get("pid") and e.get("gpus")]
        if not ranks or self.failed is not None:
            return GpuReadings()
        try:
            inventory = load_inventory(self.env)
            self.reader = self.reader or GpuReader(self.env)
            procs = self.reader.processes()
        except Exception as exc:  # InventoryError, ImportError, NVMLError (no common base to name)
            self.failed = str(exc)
            return GpuReadings()
        gpus = {u.uuid: (u.memory_used, u.memory_total, u.utilization) for u in inventory.units()}
        table = leftovers.snapshot()
        owner = owners(table, ranks, None)
        held: dict[tuple[int, str], int] = {}
        for p in procs:
            if p.pid in owner:
                key = (ranks[owner[p.pid]].rank, p.uuid)
                held[key] = held.get(key, 0) + (p.used or 0)
        return GpuReadings(gpus, held, known=True)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


# --- the command's two ways: one snapshot (--json), and the live table --------------------------------------------


def _readings(status: Mapping[str, Any]) -> dict[int, ProcReading | None]:
    """The running ranks' processes, by pid (each checked against its start time, where the file has one)."""
    return {int(e["pid"]): read_process(int(e["pid"]), e.get("start")) for e in status.get("ranks", [])
            if e.get("pid") and e.get("code") is None}


def await_status(run_dir: Path, alive: Callable[[], bool], timeout: float) -> dict[str, Any] | None:
    """The launcher's status file: written at its first wake-up after the ranks start, so a job found by its ranks
    has one at once, or within `timeout` while `alive()` (its launcher runs); None: it ended, or predates it."""
    from ddpboot.launch.observe.status import read_status

    deadline = time.monotonic() + timeout
    while (status := read_status(run_dir)) is None and alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # the launcher writes the file; nothing to wait on but its appearance
    return status


class Sampler:
    """Rows from the status and two looks at the ranks' processes: the previous one (the CPU % is over the time
    between them) and now."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.gpus = GpuReader(env)
        self.before: dict[int, ProcReading | None] = {}
        self.at = time.monotonic()

    def look(self, status: Mapping[str, Any]) -> None:
        self.before, self.at = _readings(status), time.monotonic()

    def rows(self, status: Mapping[str, Any]) -> list[Row]:
        now = _readings(status)
        at = time.monotonic()
        rows = build_rows(status, self.before, now, at - self.at, self.gpus.read(status), time.time())
        self.before, self.at = now, at
        return rows


def sample_once(status: Mapping[str, Any], interval: float, env: Mapping[str, str]) -> list[Row]:
    """One snapshot's rows, the CPU % measured over `interval` seconds."""
    sampler = Sampler(env)
    try:
        sampler.look(status)
        time.sleep(interval)  # the CPU % is measured over this time
        return sampler.rows(status)
    finally:
        sampler.gpus.close()


def print_once(status: Mapping[str, Any], rows: list[Row]) -> None:
    """The table once, as wide as COLUMNS (200 in a pipe): for a pipe, a file or `watch`."""
    from ddpboot.cli.output import console

    con = console()
    con.print(render(status, rows, con.width))


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A function that waits up to its timeout for a key and returns it ("" for none): stdin in cbreak mode while
    the table is shown (so `q` needs no Enter; Ctrl-C still interrupts), restored after. Without a terminal on
    stdin, it only waits."""
    import select
    import sys

    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else -1
    if fd < 0:
        def wait(timeout: float) -> str:
            time.sleep(timeout)  # the refresh's pace: nothing to wait for
            return ""
        yield wait
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def key(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else ""

    try:
        yield key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def watch(run_dir: Path, alive: Callable[[], bool], status: dict[str, Any], interval: float,
          env: Mapping[str, str]) -> str:
    """The live table, redrawn in place every `interval` seconds until `q`, Ctrl-C or the job's end (`alive()`
    false: its launcher has exited); returns why it stopped ("q" or "ended")."""
    from rich.live import Live

    from ddpboot.cli.output import console
    from ddpboot.launch.observe.status import read_status

    con = console()
    sampler = Sampler(env)
    footer = f"refreshed every {interval:g} s · q or Ctrl-C to leave"
    try:
        with _keys() as key, Live(console=con, auto_refresh=False, vertical_overflow="ellipsis") as live:
            while True:
                live.update(render(status, sampler.rows(status), con.width, footer), refresh=True)
                if key(interval).lower() == "q":
                    return "q"
                fresh = read_status(run_dir)
                if fresh is None or not alive():
                    return "ended"
                status = fresh
    except KeyboardInterrupt:
        return "q"
    finally:
        sampler.gpus.close()
        if not con.is_terminal:  # rich ends the last frame's line on a terminal only
            con.line()
