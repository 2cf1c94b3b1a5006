"""The command line of a job of several hosts (`--hostfile FILE`, `--hosts h1:N,h2:N`; launch/remote.py runs it):
which of the options given here every host's launcher gets, and `ddpboot plan --hostfile FILE`'s map of the job.

Every host's launcher gets the options as the user gave them (on the command line or through their variable,
PET_NPROC_PER_NODE and the like), as flags; the hosts' own options (the node options, the GPU selection that
each host's line may change, the hosts and ssh options) are set per host by launch/remote.py.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Collection
from typing import Any

from ddpboot.cli.output import console, escape
from ddpboot.errors import UsageError
from ddpboot.launch import remote
from ddpboot.launch.config import HostOptions, NodeOptions, RunOptions, SelectionOptions
from ddpboot.launch.paths import current_directory

HOST_OWN = frozenset({"nnodes", "node_rank", "master_addr", "master_port", "nproc", "gpus", "exclude", "hostfile",
                      "hosts", "ssh_port", "ssh_identity_file", "env"})
"""The options launch/remote.py sets for each host itself."""
NOT_FORWARDED = frozenset({"dry_run", "as_json", "version", "print_completion", "no_probe", "wide"})


def forwarded_options(ctx: Any, skip: Collection[str] = HOST_OWN | NOT_FORWARDED) -> list[str]:
    """The command's options that the user gave (on the command line, or through their environment variable), as
    a command line again, but those named in `skip` (parameter names)."""
    out: list[str] = []
    for param in ctx.command.params:
        opts = list(getattr(param, "opts", ()))
        if param.name in skip or not opts or param.param_type_name != "option":
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        value = ctx.params.get(param.name)
        if getattr(param, "is_flag", False):
            secondary = list(getattr(param, "secondary_opts", ()))
            if value:
                out.append(opts[0])
            elif secondary:
                out.append(secondary[0])
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                out += [opts[0], str(item)]
    return out


def _version() -> str:
    return str(importlib.import_module("ddpboot").__version__)


def run(options: RunOptions, ctx: Any, as_json: bool) -> int:
    """`ddpboot --hostfile FILE ...`: the dry run (what each host would get), or the job."""
    job = remote.plan_hosts(options, forwarded_options(ctx), dict(os.environ), current_directory(), _version())
    if options.dry_run:
        if as_json:
            print(json.dumps(remote.dry_run_json(job), indent=2))
        else:
            for line in remote.dry_run_lines(job):
                print(line)
        return 0
    return remote.run_hosts(job)


def plan(selection: SelectionOptions, nodes: NodeOptions, hosts: HostOptions, ctx: Any, probe: bool,
         as_json: bool) -> None:
    """`ddpboot plan --hostfile FILE`: the whole job's map, each host's part as that host plans it (`--no-probe`:
    not asked)."""
    job = remote.plan_probe(selection, nodes, hosts, forwarded_options(ctx), dict(os.environ),
                            current_directory(), _version())
    plans: list[dict[str, Any] | None] = [None] * len(job.specs)
    if probe:
        for answer in remote.probe_hosts(job):
            error = remote.answer_error(answer, job.ssh)
            if error is not None:
                raise UsageError(error)
            plans[answer.spec.node] = json.loads(answer.out)
    rows = [_row(spec, plans[spec.node], len(job.specs)) for spec in job.specs]
    if as_json:
        print(json.dumps({"source": job.source, "store": {"master_addr": job.master[0], "port": job.master[1]},
                          "hosts": rows}, indent=2))
        return
    _render(job, rows)


def _row(spec: remote.HostSpec, plan: dict[str, Any] | None, nnodes: int) -> dict[str, Any]:
    row: dict[str, Any] = {"host": spec.host.name, "node_rank": spec.node, "local": spec.local, "plan": plan}
    if plan is not None:
        row["ranks"] = [r["rank"] for r in plan["ranks"]]
        row["gpus"] = [[g["index"] for g in r["gpus"]] for r in plan["ranks"]]
        row["gpu_names"] = sorted({g["name"] for r in plan["ranks"] for g in r["gpus"]})
    elif spec.host.slots is not None:
        first = spec.node * spec.host.slots
        row["ranks"] = list(range(first, first + spec.host.slots))
    return row


def _ranks(ranks: list[int] | None) -> str:
    if not ranks:
        return "not asked"
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def _gpus(row: dict[str, Any]) -> str:
    if row["plan"] is None:
        return "not asked"
    used = [i for gpus in row["gpus"] for i in gpus]
    names = f" ({', '.join(row['gpu_names'])})" if row["gpu_names"] else ""
    return ", ".join(map(str, used)) + names if used else "none: CPU ranks"


def _render(job: remote.HostsJob, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    counts = [len(r["ranks"]) for r in rows if r.get("ranks")]
    world = f"world size {sum(counts)} · " if len(counts) == len(rows) else ""
    con = console()
    nodes = f"{len(rows)} node{'s' if len(rows) > 1 else ''}"
    con.print(escape(f"{world}{nodes} from {job.source} · {remote.store_text(job)}"))
    table = Table(show_edge=False, header_style="bold")
    for header in ("host", "node", "ranks", "GPUs", "started"):
        table.add_column(header, no_wrap=True)
    for row, spec in zip(rows, job.specs, strict=True):
        table.add_row(escape(row["host"]), str(row["node_rank"]), _ranks(row.get("ranks")), escape(_gpus(row)),
                      "here, no ssh" if spec.local else "over ssh")
    con.print(table)
