"""What the tools and a dry run print: the plan table, the GPU table, the smoke report, each worker's command."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ddpboot.cli.output import console, escape
from ddpboot.selection.affinity import format_cpu_list
from ddpboot.units import format_size, plural

if TYPE_CHECKING:
    from ddpboot.launch.spec import LaunchSpec
    from ddpboot.selection.inventory import Inventory
    from ddpboot.selection.planner import Plan
    from ddpboot.smoke import Report


def short_uuid(uuid: str) -> str:
    """A GPU UUID cut to fit a table column (its first 12 characters tell GPUs apart)."""
    return uuid[:12] + "…" if len(uuid) > 12 else uuid


def render_plan(plan: Plan) -> None:
    """Which GPU each rank gets, and what cuda:0 means inside it."""
    from rich.table import Table

    con = console()
    nodes = plural(plan.nnodes, "node")
    head = (
        f"[bold]world size {plan.world_size}[/] · {nodes} (this is node {plan.node_rank}) · "
        f"isolation [bold]{plan.isolation}[/] · backend {plan.backend} · inventory {plan.inventory_source} · "
        f"visible: {plan.visible}"
    )
    if plan.cluster.get("description"):
        head += f" · nodes from {escape(str(plan.cluster['description']))}"
    con.print(head)
    table = Table(show_edge=False, header_style="bold")
    cols = ("rank", "local", "GPU", "UUID", "PCI bus id", "name", "free", "CUDA_VISIBLE_DEVICES", "device", "cores")
    for col in cols:
        table.add_column(col, no_wrap=col in ("UUID", "PCI bus id", "CUDA_VISIBLE_DEVICES"))
    for slot in plan.ranks:
        cores = format_cpu_list(slot.cpus) or "any"
        if not slot.gpus:
            table.add_row(str(slot.rank), str(slot.local_rank), "-", "-", "-", "CPU", "-", '""', "cpu", cores)
            continue
        cvd = ",".join(short_uuid(u) for u in slot.cuda_visible_devices.split(","))
        if plan.isolation == "node" and len(plan.ranks) > 1:
            cvd = f"all {len(slot.cuda_visible_devices.split(','))} selected"
        for j, gpu in enumerate(slot.gpus):
            first = j == 0
            device = slot.device if first else f"cuda:{int(slot.device.split(':')[1]) + j}"
            table.add_row(
                str(slot.rank) if first else "",
                str(slot.local_rank) if first else "",
                gpu.label,
                short_uuid(gpu.uuid),
                gpu.pci_bus_id,
                gpu.name,
                format_size(gpu.memory_free),
                cvd if first else "",
                f"{device} = GPU {gpu.label}",
                cores if first else "",
            )
    con.print(table)
    for note in plan.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def render_gpus(records: list[dict[str, Any]], inventory: Inventory) -> None:
    from rich.table import Table

    con = console()
    if not records:
        con.print("No GPUs" + (": " + "; ".join(inventory.notes) if inventory.notes else "."), soft_wrap=True)
        return
    table = Table(show_edge=False, header_style="bold")
    for col in ("GPU", "UUID", "PCI bus id", "name", "memory used", "util", "procs", "state"):
        table.add_column(col, no_wrap=True)

    def row(rec: dict[str, Any], label: str) -> None:
        if rec["locked"]:
            h = rec["locked_by"]
            state = f"[magenta]locked[/] by {h['user']} (pid {h['pid']}: {h['command']})"
        elif not rec["visible"]:
            state = "[dim]not visible[/]"
        elif rec["excluded"]:
            state = "[dim]excluded[/]"
        elif rec["busy"]:
            state = "[red]busy[/] (" + "; ".join(rec["busy_reasons"]) + ")"
        else:
            state = "[green]free[/]"
        if rec.get("mig_devices"):
            state = "MIG mode"
        util = "?" if rec["utilization"] is None else f"{rec['utilization']}%"
        used = f"{format_size(rec['memory_used'])} / {format_size(rec['memory_total'])}"
        table.add_row(
            label, short_uuid(rec["uuid"]), rec["pci_bus_id"], rec["name"], used, util, str(len(rec["processes"])),
            state,
        )

    for rec in records:
        row(rec, str(rec["index"]))
        for mig in rec.get("mig_devices", []):
            row(mig, f"  {mig['index']}:{mig['mig_index']}")
    con.print(table)
    for note in inventory.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


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
    con.print(f"smoke {verdict}: {report.plan.world_size} ranks, {report.plan.backend}, "
              f"{report.wall_seconds:.1f} s")


def render_dry_run(plan: Plan, spec: LaunchSpec, env: Mapping[str, str]) -> None:
    """The plan, the store, and each rank's command line and the variables ddpboot sets (with what they were)."""
    from ddpboot.launch.env import EnvContext, worker_argv, worker_vars

    render_plan(plan)
    port = spec.master_port or 0
    ctx = EnvContext(spec.master_addr, port, spec.run_id, spec.role, 0, spec.max_restarts,
                     ",".join(s.name for s in spec.signals))
    print()
    print(f"store: {spec.store} server on {spec.bind_addr}:" + (str(port) if port else "<a free port bound at launch>"))
    for slot in plan.ranks:
        argv = worker_argv(spec.target, spec.python, slot.local_rank)
        own = worker_vars(plan, slot, ctx, env, f"<log dir>/attempt_0/rank{slot.rank}.error.json")
        if not port:
            own["MASTER_PORT"] = "<port bound at launch>"
        print(f"\nrank {slot.rank} (local rank {slot.local_rank}): {shlex.join(argv)}")
        if slot.cpus:
            print(f"  cpu affinity: {format_cpu_list(slot.cpus)}")
        for key, value in own.items():
            was = f"  (was {env[key]!r})" if key in env and env[key] != value else ""
            print(f"  {key}={shlex.quote(value)}{was}")
