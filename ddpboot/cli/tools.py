"""The tools: `ddpboot plan` (which GPU each rank would get), `ddpboot gpus` (the machine's GPUs), `ddpboot smoke`
(a multi-GPU self-test), `ddpboot stacks` (where every rank of a running job is), `ddpboot top` (a running job's
ranks, live). Planning reads NVML only: nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from ddpboot.cli.options import HOSTS, NODES, SELECTION, only, with_options
from ddpboot.cli.output import handle_errors
from ddpboot.cli.render import render_gpus, render_plan, render_smoke
from ddpboot.errors import UsageError
from ddpboot.launch import preview, runner
from ddpboot.launch.config import HostOptions, NodeOptions, Request, SelectionOptions, build_plan, parse_selection
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.gpu_list import parse_gpu_list, resolve_list
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.ledger import clear as ledger_clear
from ddpboot.selection.ledger import failing
from ddpboot.selection.locks import current_holders, lock_dir
from ddpboot.selection.planner import Plan, busy_reasons
from ddpboot.selection.visible import resolve_visible
from ddpboot.units import parse_size

TOOLS = ("plan", "gpus", "smoke", "stacks", "top", "warm")
"""The subcommands: a first argument that names one runs it; anything else is a job's SCRIPT (cli/app.py)."""

# Help epilogs: one line per paragraph, as rich help reflows each paragraph to the terminal's width.
INDEX_RULES = (
    "GPU numbering: indices given to --gpus and --exclude are physical indices, the ones nvidia-smi and "
    "`ddpboot gpus` show, whatever CUDA_VISIBLE_DEVICES says. When the launcher inherits a CUDA_VISIBLE_DEVICES "
    "(e.g. from SLURM), they must still name GPUs it allows: with CUDA_VISIBLE_DEVICES=2,3, `--gpus 3` means "
    "physical GPU 3 and `--gpus 0` is an error. UUIDs (or unique prefixes: GPU-5f1c), PCI bus ids (0000:18:00.0), "
    "ranges (0-3) and MIG instances (3:1) are accepted too. Each worker then sees only its own GPUs, as cuda:0."
)


def open_report(path: str, option: str) -> TextIO:
    """The file a report will be written to, opened (created or truncated) now, so that a path that cannot be
    written is an error before anything runs rather than a lost report after."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path}: that is a directory. Give a file path, e.g. {target / 'report.xml'}.")
    try:
        return target.open("w", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write there ({exc.strerror}). Give a path in an existing "
                         "directory you can write to.") from None


def plan_for(selection: SelectionOptions, nodes: NodeOptions, from_env: Mapping[str, str] | None = None) -> Plan:
    """The plan this node would run now, from the options and the environment, through the same steps as a run's
    (launch/config.py, then the runner's planning and checks)."""
    return runner.plan_only(build_plan(selection, nodes, dict(os.environ), from_env=from_env))


def gpu_states(inventory: Inventory, req: Request, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """One record per GPU (and MIG instance) with the derived states `ddpboot gpus` shows."""
    visible = resolve_visible(inventory, env)
    excluded = {u.uuid for u in resolve_list(req.exclude, inventory, "--exclude")} if req.exclude else set()
    holders = current_holders([u.uuid for u in inventory.units()], lock_dir(env))
    marks = failing([u.uuid for u in inventory.units()], lock_dir(env))
    out = []

    def record(unit: GPU) -> dict[str, Any]:
        mark = marks.get(unit.uuid)
        reasons = busy_reasons(unit, req, failing={unit.uuid: mark.describe()} if mark else None)
        holder = holders.get(unit.uuid)
        rec = unit.to_json()
        rec.update(
            utilization=unit.utilization,
            processes=list(unit.processes),
            cpu_affinity=list(unit.cpu_affinity),
            numa_node=unit.numa_node,
            visible=visible.allows(unit) if not unit.mig_enabled else any(visible.allows(m) for m in unit.mig_devices),
            busy=bool(reasons),
            busy_reasons=reasons,
            excluded=unit.uuid in excluded,
            locked=holder is not None,
            locked_by=holder.__dict__ if holder else None,
            failing=asdict(mark) if mark else None,
        )
        return rec

    for gpu in inventory.gpus:
        rec = record(gpu)
        if gpu.mig_enabled:
            rec["mig_devices"] = [record(m) for m in gpu.mig_devices]
        out.append(rec)
    return out


def clear_marks(inventory: Inventory, text: str, env: Mapping[str, str]) -> None:
    """`ddpboot gpus --clear GPUS`: each GPU's failing mark removed (selection/ledger.py), said GPU by GPU."""
    units = resolve_list(parse_gpu_list(text, "--clear"), inventory, "--clear")
    directory = lock_dir(env)
    for unit in units:
        try:
            was = ledger_clear(directory, unit.uuid)
        except OSError as exc:
            mark = failing([unit.uuid], directory).get(unit.uuid)
            who = f" (written by {mark.user})" if mark else ""
            raise UsageError(f"--clear {text}: cannot clear GPU {unit.label}'s failing mark{who} in {directory}: "
                             f"{exc.strerror}. Only the user who wrote it, or root, can clear it.") from None
        print(f"GPU {unit.label}: " + (f"failing mark cleared ({was.describe()})" if was else "was not marked failing"))


JobArgument = Annotated[
    str | None,
    typer.Argument(help="The job: its launcher's pid, its run directory (--log-dir's run folder) or its run id. "
                   "Default: the one job of yours that runs."),
]
"""`ddpboot stacks` and `ddpboot top`: which running job."""

tools = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="ddpboot's tools. Run a job with `ddpboot [OPTIONS] SCRIPT [ARGS...]` (see `ddpboot --help`).",
    rich_markup_mode="rich",
)


@tools.command("plan", short_help="Which GPU each rank would get; starts nothing.", epilog=INDEX_RULES)
@handle_errors
@with_options(SELECTION, NODES, HOSTS)
def plan_cmd(
    selection: SelectionOptions,
    nodes: NodeOptions,
    hosts: HostOptions,
    from_env: dict[str, str],
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show every column, each GPU's full UUID and PCI bus id "
                                       "included: one block per rank where the table does not fit.")] = False,
    no_probe: Annotated[bool, typer.Option("--no-probe", help="With --hostfile or --hosts: do not ask the hosts "
                                           "(their ranks from the slots, their GPUs: not asked).")] = False,
) -> None:
    """Show which GPU each rank would get, and what cuda:0 means inside each worker. Starts nothing."""
    if hosts.given:  # the whole job's map, each host asked over ssh (cli/hosts.py)
        from ddpboot.cli import hosts as on_hosts

        on_hosts.plan(selection, nodes, hosts, ctx, not no_probe, as_json)
        return
    if no_probe:
        raise UsageError("--no-probe is for a job of several hosts (--hostfile FILE or --hosts H1,H2): there are no "
                         "hosts to ask here; drop it.")
    plan = plan_for(selection, nodes, from_env)
    if as_json:
        print(json.dumps(preview.plan_json(plan), indent=2))
    else:
        render_plan(plan, wide)


@tools.command("gpus", short_help="The machine's GPUs: free, busy, excluded.", epilog=INDEX_RULES)
@handle_errors
@with_options(only(SELECTION, "exclude", "max_used_memory", "max_util"))
def gpus_cmd(
    selection: SelectionOptions,
    as_json: Annotated[bool, typer.Option("--json", help="Print the inventory as one JSON object.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show every column, with full UUIDs (cut to 12 characters "
                                       "otherwise): one block per GPU where the table does not fit.")] = False,
    clear: Annotated[str | None, typer.Option("--clear", metavar="GPUS", help="Clear the failing mark of these GPUs "
                                              "(indices, UUIDs, as --gpus takes them): later jobs choose them "
                                              "again.")] = None,
) -> None:
    """List the machine's GPUs (NVML, or DDPBOOT_FAKE_GPUS): free, busy, failing, excluded or not visible."""
    env = os.environ
    req = parse_selection(selection)
    inventory = load_inventory(env)
    if clear is not None:
        clear_marks(inventory, clear, env)
        return
    records = gpu_states(inventory, req, env)
    if as_json:
        print(json.dumps({"gpus": records, "source": inventory.source, "notes": list(inventory.notes)}, indent=2))
    else:
        render_gpus(records, inventory, wide)


@tools.command("smoke", short_help="A multi-GPU self-test on the planned ranks.", epilog=INDEX_RULES)
@handle_errors
@with_options(SELECTION, NODES)
def smoke_cmd(
    selection: SelectionOptions,
    nodes: NodeOptions,
    from_env: dict[str, str],
    checks: Annotated[
        str | None,
        typer.Option("--checks", help="Run only these checks (comma list). Default: all. Names: "
                     "mapping, all_reduce, broadcast, all_gather, reduce_scatter, barrier, ddp, bandwidth, "
                     "isolation, timing."),
    ] = None,
    max_bytes: Annotated[
        str, typer.Option("--max-bytes", help="Largest all_reduce for the bandwidth check (capped to free memory).")
    ] = "64MiB",
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds for the whole run; a hang becomes a failed check.")
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    junit: Annotated[
        str | None, typer.Option("--junit-xml", help="Also write a JUnit XML report here (for CI systems).")
    ] = None,
) -> None:
    """Run a multi-GPU self-test on the planned ranks: mapping, collectives, DDP, bandwidth, isolation, timing.

    Exit 0 only when every check passed."""
    from ddpboot.smoke import junit_xml, parse_checks, run_smoke

    names = parse_checks(checks)
    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: give a positive number of seconds.")
    plan = plan_for(selection, nodes, from_env)
    limit = parse_size(max_bytes, "--max-bytes")
    report_file = open_report(junit, "--junit-xml") if junit else None  # a bad path fails before the test runs
    report = run_smoke(plan, names, limit, timeout)
    if report_file is not None:
        with report_file:
            report_file.write(junit_xml(report))
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        render_smoke(report)
    raise typer.Exit(0 if report.passed else 1)


@tools.command("stacks", short_help="Where every rank of a running job is now.")
@handle_errors
def stacks_cmd(
    run: JobArgument = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the dump as one JSON object.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the launcher's dump.")] = 30.0,
) -> None:
    """Print every rank's current Python stack, with one line per rank naming the collective, barrier or
    destroy_process_group it waits in, and a verdict naming the rank to look at. The launcher collects them
    (py-spy, or the ranks' faulthandler) when sent SIGUSR2, and keeps a copy in its run directory."""
    from ddpboot.launch.observe.stacks.find import find, request_dump

    if timeout <= 0:
        raise UsageError(f"--timeout {timeout}: give a positive number of seconds.")
    record = find(run)
    path = request_dump(record, timeout)
    if path is None:
        raise UsageError(f"the launcher (pid {record.pid}) wrote no stack dump into {record.run_dir} within "
                         f"{timeout:g} s: it may have exited or be busy; try again with a longer --timeout.")
    if as_json:
        print(path.read_text(encoding="utf-8"), end="")
    else:
        print(path.with_suffix(".txt").read_text(encoding="utf-8"), end="")


@tools.command("top", short_help="A running job's ranks, live.")
@handle_errors
def top_cmd(
    run: JobArgument = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one snapshot as a JSON object and exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between two refreshes (with --json: the time CPU % is "
                            "measured over).")
    ] = 1.0,
) -> None:
    """Show a running job's ranks, one line each, refreshed in place: pid, state, CPU %, memory, GPU memory and
    utilisation, seconds since the rank's last output, its progress bar, and the GPU watch's warnings. `q` or
    Ctrl-C leaves. Into a pipe or a file (not a terminal) it prints the table once and exits, as `top -b -n 1`
    does: `watch ddpboot top` refreshes it. GPUs are read as `ddpboot gpus` reads them (NVML, or
    DDPBOOT_FAKE_GPUS)."""
    import time

    from ddpboot.cli import top
    from ddpboot.launch.observe import sample
    from ddpboot.launch.observe.stacks.find import find

    if not 0 < interval <= 3600:
        raise UsageError(f"--interval {interval:g}: give the seconds between two refreshes, above 0 (e.g. 1 or 0.5).")
    record = find(run)
    status = sample.await_status(record.run_dir, record.running, 5.0)
    if status is None:
        raise UsageError(f"the launcher (pid {record.pid}) publishes no status in {record.run_dir}: it has ended, "
                         "or it is a ddpboot without `ddpboot top`.")
    if as_json or not sys.stdout.isatty():  # a pipe, a file, `watch`: one snapshot, as `top -b -n 1` prints
        rows = sample.sample_once(status, interval, os.environ)
        if as_json:
            print(json.dumps(sample.snapshot_json(status, rows, time.time()), indent=2))
        else:
            top.print_once(status, rows)
        return
    if top.watch(record.run_dir, record.running, status, interval, os.environ) == "ended":
        print(f"ddpboot top: the job (run id {record.run_id}, launcher pid {record.pid}) has ended.")


@tools.command("warm", short_help="This user's warm process (for --warm).")
@handle_errors
def warm_cmd(
    action: Annotated[str, typer.Argument(help="status (the warm process's state) or stop (end it now).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer as one JSON object.")] = False,
) -> None:
    """This user's warm process on this node (`ddpboot --warm`): `status` shows its pid, age, launches, the
    launches it serves now and what it preloaded; `stop` ends it (launches it serves go on until they end)."""
    from ddpboot.cli.warm import warm

    raise typer.Exit(warm(action, as_json, os.environ))
