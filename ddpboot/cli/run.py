"""`ddpboot [OPTIONS] SCRIPT [ARGS...]`: run SCRIPT as a DDP job on the planned ranks.

Option parsing stops at SCRIPT: everything after it is passed to the script untouched (`ddpboot --nproc 2 train.py
--epochs 3` gives the script `--epochs 3`). torchrun's options are accepted under their dash and underscore
spellings, with their PET_* environment defaults, and mean the same thing (run_options.py declares them).

The command collects its options into one raw RunOptions and hands it to launch/config.py, which checks everything
that can fail because of what was asked before anything starts (exit 2 with one message, no process left behind)
and builds the LaunchConfig; launch/runner.py runs it, or shows it with --dry-run.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer

from ddpboot.cli.options import HOSTS, NODES, SELECTION, with_options
from ddpboot.cli.output import handle_errors
from ddpboot.cli.render import render_dry_run
from ddpboot.cli.run_options import COMMAND, REFUSED, RUN, ArgsArgument, CommandOptions, RefusedOptions, ScriptArgument
from ddpboot.cli.tools import INDEX_RULES
from ddpboot.errors import UsageError
from ddpboot.launch import config as launch_config
from ddpboot.launch import runner
from ddpboot.launch.config import HostOptions, LaunchConfig, NodeOptions, RunOptions, SelectionOptions
from ddpboot.launch.paths import current_directory

run_app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    help="Run SCRIPT (with ARGS) as a DDP job: one worker per rank on exactly the planned GPUs, with torchrun's "
    "environment, supervised (fail-fast, signals, no orphans). `ddpboot plan` shows the plan without running; "
    "`ddpboot gpus` lists GPUs.",
)

@run_app.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog=INDEX_RULES,
    help="Run SCRIPT as a DDP job on the planned GPUs (see `ddpboot plan`); exit with the failing rank's code.",
    no_args_is_help=True,
)
@handle_errors
@with_options(SELECTION, NODES, HOSTS, RUN, COMMAND, REFUSED)
def run(
    script: ScriptArgument,
    selection: SelectionOptions,
    nodes: NodeOptions,
    hosts: HostOptions,
    own: dict[str, Any],
    command: CommandOptions,
    refused: RefusedOptions,
    from_env: dict[str, str],
    ctx: typer.Context,
    args: ArgsArgument = None,
) -> None:
    """Run SCRIPT as a DDP job on the planned GPUs (see `ddpboot plan`); exit with the failing rank's code."""
    # --version and --print-completion are eager: they printed and exited before this runs
    as_json = command.as_json
    options = RunOptions(script=script, args=tuple(args or ()), selection=selection, nodes=nodes, hosts=hosts,
                         refused=refused.given(), from_env=from_env, **own)
    if as_json and not options.dry_run:
        raise UsageError("--json prints a dry run: add --dry-run, or drop --json (a job's output is its ranks').")
    if hosts.given:  # one launcher per host, over ssh (launch/remote.py)
        from ddpboot.cli import hosts as on_hosts

        raise typer.Exit(on_hosts.run(options, ctx, as_json))
    try:
        config = launch_config.build(options, dict(os.environ), current_directory())
        code = _dry_run(config, as_json) if config.dry_run else runner.run(config)
    except KeyboardInterrupt:  # Ctrl-C while planning or waiting for GPUs: nothing was started
        print("ddpboot: interrupted before anything started", file=sys.stderr)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def _dry_run(config: LaunchConfig, as_json: bool) -> int:
    """Print the plan, the store and each worker's command and variables; start nothing."""
    dry = runner.dry_run(config)
    if as_json:
        print(json.dumps(dry.to_json(), indent=2))
        return 0
    for note in config.notes:
        print(f"note: {note}")
    if config.fast_start:
        preloads = f" and {', '.join(config.preloads)}" if config.preloads else ""
        if config.warm:
            print(f"warm launch: your warm process on this node (started if none runs) has imported torch{preloads} "
                  f"with {config.python}, and forks every rank")
        else:
            print(f"fast start: one process imports torch{preloads} with {config.python}, then forks every rank")
    render_dry_run(dry, config.env)
    return 0
