"""What the tools and a dry run print: the plan table, the GPU table, the smoke report, each worker's command."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpboot.cli.output import console, escape
from ddpboot.selection.affinity import format_cpu_list
from ddpboot.selection.ledger import Mark
from ddpboot.selection.locks import Holder
from ddpboot.units import format_size, short_uuid

if TYPE_CHECKING:
    from ddpboot.launch.preview import DryRun
    from ddpboot.selection.gpu import Inventory
    from ddpboot.selection.planner import Plan
    from ddpboot.smoke import Report


@dataclass
class Column:
    """A table column: its header, its cells (rich markup), and whether it carries the map (never dropped)."""

    header: str
    cells: list[str]
    keep: bool = False

    def width(self) -> int:
        from rich.text import Text

        return max([len(self.header)] + [Text.from_markup(c).cell_len for c in self.cells])


def fit_columns(columns: list[Column], width: int, priority: list[str]) -> list[Column]:
    """The columns that fit in `width`, in their original order: the map columns always (they carry the point of
    the table), then the others in `priority` order while the table stays on one line per row. A column costs its
    widest cell plus three characters (padding and the rule between columns)."""
    by_header = {c.header: c for c in columns}
    chosen = {c.header for c in columns if c.keep}
    used = sum(by_header[h].width() + 3 for h in chosen)
    for header in priority:
        cost = by_header[header].width() + 3
        if header not in chosen and used + cost <= width:
            chosen.add(header)
            used += cost
    return [c for c in columns if c.header in chosen]


def _table(columns: list[Column]) -> Any:
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for col in columns:
        table.add_column(col.header, no_wrap=True, overflow="ellipsis" if not col.keep else "fold")
    for i in range(len(columns[0].cells) if columns else 0):
        table.add_row(*(col.cells[i] for col in columns))
    return table


def print_table(columns: list[Column], priority: list[str], wide: bool = False) -> None:
    """Print the columns that fit this console's width; rows never wrap, so each rank or GPU stays one line.
    `wide` shows every column: as a table where it fits, else as one record per row (print_records)."""
    from rich.measure import Measurement

    con = console()
    if wide:
        table = _table(columns)
        if Measurement.get(con, con.options.update_width(10**6), table).maximum <= con.width:
            con.print(table)
        else:
            print_records(columns)
        return
    shown = fit_columns(columns, con.width, priority)
    con.print(_table(shown))
    dropped = [c.header for c in columns if c not in shown]
    if dropped:
        con.print(f"[dim]({', '.join(dropped)}: not shown at {con.width} columns; see --wide or --json)[/]")


def print_records(columns: list[Column]) -> None:
    """One `key  value` block per row, for a table wider than the terminal: the map columns (`keep`) name the
    block, every other non-empty cell is a line of it. A row whose naming cells are empty (a rank's second GPU)
    continues the block above. A list too long for a line breaks after its commas."""
    from rich.table import Table
    from rich.text import Text

    con = console()
    named = [c for c in columns if c.keep]
    rest = [c for c in columns if not c.keep]
    key_width = max((len(c.header) for c in rest), default=0) + 2
    room = con.width - key_width - 2
    for i in range(len(columns[0].cells) if columns else 0):
        title = " · ".join(f"{c.header} {c.cells[i].strip()}" for c in named if c.cells[i].strip())
        first = bool(columns[0].cells[i].strip())
        if first and i:
            con.print()
        if title:
            con.print(f"[bold]{title}[/]" if first else f"  {title}")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, min_width=key_width)
        grid.add_column(overflow="fold")
        for col in rest:
            value = col.cells[i]
            if Text.from_markup(value).cell_len > room:
                value = value.replace(",", ",\n")
            if value.strip():
                grid.add_row(f"  {col.header}", value)
        con.print(grid)


def plan_head(plan: Plan, width: int) -> list[str]:
    """The plan's first lines: the job's size and mode, and where the GPUs came from when that is worth a word (no
    GPU found, CUDA_VISIBLE_DEVICES narrowing them, nodes from SLURM or flags). Parts are joined by ` · ` and a
    line breaks between parts, never inside one, when `width` would be passed."""
    from rich.text import Text

    nodes = f"{plan.nnodes} nodes (this is node {plan.node_rank})" if plan.nnodes > 1 else "1 node"
    parts = [f"[bold]world size {plan.world_size}[/]", nodes, f"isolation [bold]{plan.isolation}[/]",
             f"backend {plan.backend}"]
    if plan.inventory_source == "none":
        parts.append("no GPUs found (`ddpboot gpus` says why)")
    if plan.visible != "all GPUs":
        parts.append(escape(plan.visible))
    if plan.cluster.get("description") and plan.cluster.get("source") != "single":
        parts.append(f"nodes from {escape(str(plan.cluster['description']))}")
    lines = [parts[0]]
    for part in parts[1:]:
        joined = f"{lines[-1]} · {part}"
        if Text.from_markup(joined).cell_len <= width:
            lines[-1] = joined
        else:
            lines.append(part)
    return lines


def plan_notes(plan: Plan) -> list[str]:
    """The notes `ddpboot plan` prints, each once. Without a GPU inventory (no driver, no NVML) its reason is the
    first note; the head says that no GPU was found and `ddpboot gpus` gives the reason, so it is not repeated
    here (`make demo` runs both)."""
    notes = list(plan.notes)
    if plan.inventory_source == "none" and notes:
        notes = notes[1:]
    return list(dict.fromkeys(notes))


def render_plan(plan: Plan, wide: bool = False) -> None:
    """Which GPU each rank gets, and what cuda:0 means inside it. Rank, local rank, GPU and device always show;
    the other columns as the width allows; `wide`: every column, full UUIDs and PCI bus ids included."""
    con = console()
    for line in plan_head(plan, con.width):
        con.print(line)
    headers = ("rank", "local", "GPU", "UUID", "PCI bus id", "name", "free", "CUDA_VISIBLE_DEVICES", "device",
               "cores")
    cells: dict[str, list[str]] = {h: [] for h in headers}

    def add(*values: str) -> None:
        for header, value in zip(headers, values, strict=True):
            cells[header].append(value)

    for slot in plan.ranks:
        cores = format_cpu_list(slot.cpus) or "any"
        if not slot.gpus:
            add(str(slot.rank), str(slot.local_rank), "-", "-", "-", "CPU", "-", '""', "cpu", cores)
            continue
        cvd = ",".join(u if wide else short_uuid(u) for u in slot.cuda_visible_devices.split(","))
        if not plan.isolation.own_gpus_only and len(plan.ranks) > 1:
            cvd = f"all {len(slot.cuda_visible_devices.split(','))} selected"
        for j, gpu in enumerate(slot.gpus):
            first = j == 0
            device = slot.device if first else f"cuda:{int(slot.device.split(':')[1]) + j}"
            add(
                str(slot.rank) if first else "",
                str(slot.local_rank) if first else "",
                gpu.label,
                gpu.uuid,
                gpu.pci_bus_id,
                escape(gpu.name),
                format_size(gpu.memory_free),
                cvd if first else "",
                f"{device} = GPU {gpu.label}",
                cores if first else "",
            )
    keep = {"rank", "local", "GPU", "device"}
    optional = ["CUDA_VISIBLE_DEVICES", "free", "cores", "name"] + (["UUID", "PCI bus id"] if wide else [])
    columns = [Column(h, cells[h], h in keep) for h in headers if h in keep or h in optional]
    print_table(columns, optional, wide)
    for note in plan_notes(plan):
        con.print(f"[yellow]note:[/] {escape(note)}")


def gpu_state(rec: dict[str, Any]) -> str:
    """What `ddpboot gpus` says about one GPU: failing (why, when, which job), locked (by whom), not visible,
    excluded, busy (why), or free."""
    if rec.get("mig_devices"):
        return "MIG mode"
    if rec.get("failing"):  # the whole mark is said under the table
        return "[bold red]failing[/] (" + escape(rec["failing"]["reason"].partition(" (")[0]) + ")"
    if rec["locked"]:
        h = rec["locked_by"]
        return f"[magenta]locked[/] by {escape(Holder(**h).describe())}"
    if not rec["visible"]:
        return "[dim]not visible[/]"
    if rec["excluded"]:
        return "[dim]excluded[/]"
    if rec["busy"]:
        return "[red]busy[/] (" + escape("; ".join(rec["busy_reasons"])) + ")"
    return "[green]free[/]"


def render_gpus(records: list[dict[str, Any]], inventory: Inventory, wide: bool = False) -> None:
    """The machine's GPUs, one line each. GPU index and state always show; UUIDs are cut to 12 characters and
    columns that do not fit the width are left out, unless `wide` (every column, full UUIDs; --json shows all)."""
    con = console()
    if not records:
        con.print("No GPUs" + (": " + "; ".join(inventory.notes) if inventory.notes else "."))
        con.print("Jobs here run CPU ranks with gloo: `ddpboot --cpu --nproc 2 SCRIPT`.")
        return
    headers = ("GPU", "UUID", "PCI bus id", "name", "memory used", "util", "procs", "state")
    cells: dict[str, list[str]] = {h: [] for h in headers}

    def row(rec: dict[str, Any], label: str) -> None:
        util = "?" if rec["utilization"] is None else f"{rec['utilization']}%"
        used = f"{format_size(rec['memory_used'])} / {format_size(rec['memory_total'])}"
        values = (label, rec["uuid"] if wide else short_uuid(rec["uuid"]), rec["pci_bus_id"], escape(rec["name"]),
                  used, util, str(len(rec["processes"])), gpu_state(rec))
        for header, value in zip(headers, values, strict=True):
            cells[header].append(value)

    for rec in records:
        row(rec, str(rec["index"]))
        for mig in rec.get("mig_devices", []):
            row(mig, f"  {mig['index']}:{mig['mig_index']}")
    keep = {"GPU", "state"}
    optional = ["memory used", "util", "procs", "UUID", "name", "PCI bus id"]
    print_table([Column(h, cells[h], h in keep) for h in headers], optional, wide)
    for rec in [r for r in records if r.get("failing")]:
        con.print(f"[bold red]failing:[/] GPU {rec['index']}: {escape(Mark(**rec['failing']).describe())}; "
                  f"`ddpboot gpus --clear {rec['index']}` clears the mark", soft_wrap=True)
    for note in inventory.notes:
        con.print(f"[yellow]note:[/] {escape(note)}")


def render_smoke(report: Report) -> None:
    """A verdict per check and rank, the notes, and the overall result."""
    from rich.table import Table

    con = console()
    ranks = [s.rank for s in report.plan.ranks]
    table = Table(show_edge=False, header_style="bold", title=None)
    table.add_column("check")
    for r in ranks:
        table.add_column(f"rank {r}")
    table.add_column("detail")
    mark = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "skip": "[dim]skip[/]"}
    order = list(dict.fromkeys(v.check for v in report.verdicts))
    for check in order:
        vs = [v for v in report.verdicts if v.check == check]
        cells = []
        for r in ranks:
            mine = [v for v in vs if v.rank in (r, None)]
            cells.append(mark[mine[0].status] if mine else "")
        details = list(dict.fromkeys(v.detail for v in vs if v.status == "fail")) or [vs[0].detail]
        table.add_row(check, *cells, escape("; ".join(d.splitlines()[0] if d else "" for d in details)))
    con.print(table)
    for note in report.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    verdict = "[green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
    con.print(f"smoke {verdict}: {report.plan.world_size} ranks, {report.backend}, "
              f"{report.wall_seconds:.1f} s")


def render_dry_run(dry: DryRun, env: Mapping[str, str]) -> None:
    """The plan, the store, and each rank's command line and the variables ddpboot sets (with what they were)."""
    spec = dry.spec
    render_plan(dry.plan)
    print()
    print(f"store: {spec.store} server on {spec.bind_addr}:" + (str(spec.master_port) if spec.master_port else
                                                                 "<a free port bound at launch>"))
    for worker in dry.workers:
        print(f"\nrank {worker.rank} (local rank {worker.local_rank}): {shlex.join(worker.argv)}")
        if worker.cpus:
            print(f"  cpu affinity: {format_cpu_list(worker.cpus)}")
        if worker.mem_nodes:
            print(f"  memory: preferred from NUMA node{'s' if len(worker.mem_nodes) > 1 else ''} "
                  f"{', '.join(map(str, worker.mem_nodes))}")
        for key, value in worker.variables.items():
            was = f"  (was {env[key]!r})" if key in env and env[key] != value else ""
            print(f"  {key}={shlex.quote(value)}{was}")
