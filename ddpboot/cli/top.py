"""`ddpboot top`'s table: one row per rank of a running job, laid out and drawn. The rows come from
launch/observe/sample.py (the launcher's status file and readings of the ranks' processes and GPUs); `render`
turns them into what rich shows, at any width.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ddpboot.cli.output import escape
from ddpboot.cli.render import Column, fit_columns
from ddpboot.launch.observe.sample import GpuUse, Row, Sampler
from ddpboot.launch.observe.status import StatusFile, read_status

MIN_PROGRESS = 16  # the progress column's least width; the other columns give way to it below this


def _short(n: int | None) -> str:
    """Memory in a few characters: 512M, 1.5G, 80G."""
    if n is None:
        return "?"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{n}B"


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


def gpu_cell(g: GpuUse) -> str:
    util = "" if g.utilization is None else f" {g.utilization}%"
    return f"{g.label} {_short(g.used)}{util}"


def compact_bar(text: str) -> str:
    """A progress bar as the table shows it: without its drawn part (tqdm's `|####  |`), which a narrow column
    would cut first, so the count, the times and the rate stay."""
    return " ".join(re.sub(r"\|[^|]*\|", " ", text).split())


def columns(rows: list[Row]) -> list[Column]:
    """Every column but the progress bar's, which takes what the others leave (`render`). The GPU column only
    when a rank has a GPU, the start-up's phase only while a rank starts, the straggler's (`slow`) only when a
    rank is named."""
    cols = [
        Column("rank", [str(r.rank) for r in rows], keep=True),
        Column("node", [str(r.node) for r in rows]),
        Column("pid", [str(r.pid or "-") for r in rows]),
        Column("state", [_state_cell(r.state) for r in rows], keep=True),
        Column("CPU", ["-" if r.cpu is None else f"{r.cpu:.0f}%" for r in rows]),
        Column("RSS", [_short(r.rss) if r.rss is not None else "-" for r in rows]),
        Column("GPU", [", ".join(gpu_cell(g) for g in r.gpus) or "-" for r in rows]),
        Column("quiet", [_seconds(r.quiet) for r in rows]),
        Column("phase", [r.phase or "-" for r in rows]),
        Column("slow", [f"[red]{r.straggler}[/]" if r.straggler else "-" for r in rows]),
    ]
    drop = {"GPU"} if not any(r.gpus for r in rows) else set()
    if not any(r.phase for r in rows):  # the start-up's phase only while a rank starts
        drop.add("phase")
    if not any(r.straggler for r in rows):  # the straggler's only when a rank is named
        drop.add("slow")
    return [c for c in cols if c.header not in drop]


# the order columns are kept in as the width shrinks
PRIORITY = ["slow", "phase", "pid", "quiet", "CPU", "RSS", "GPU", "node"]


def head_lines(status: StatusFile, width: int) -> str:
    """The job's line(s): parts joined by ` · `, a line breaking between parts, never inside one."""
    parts = [f"[bold]run {escape(status.run_id)}[/]", f"launcher pid {status.pid}",
             f"node {status.node_rank} ({escape(status.host)})",
             f"{len(status.ranks)} of {status.world_size} ranks here", f"attempt {status.attempt}"]
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


def render(status: StatusFile, rows: list[Row], width: int, footer: str = "") -> Any:
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
    parts += [Text(warning, style="yellow") for warning in status.warnings]
    if footer:
        parts.append(Text.from_markup(f"[dim]{footer}[/]"))
    return Group(*parts)


def print_once(status: StatusFile, rows: list[Row]) -> None:
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


def watch(run_dir: Path, alive: Callable[[], bool], status: StatusFile, interval: float,
          env: Mapping[str, str]) -> str:
    """The live table, redrawn in place every `interval` seconds until `q`, Ctrl-C or the job's end (`alive()`
    false: its launcher has exited); returns why it stopped ("q" or "ended")."""
    from rich.live import Live

    from ddpboot.cli.output import console

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
        sampler.close()
        if not con.is_terminal:  # rich ends the last frame's line on a terminal only
            con.line()
