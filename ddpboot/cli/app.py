"""The entry point: `ddpboot plan|gpus|smoke ...` runs a tool, anything else is a job (`ddpboot [OPTIONS] SCRIPT`)."""

from __future__ import annotations

import sys
from typing import NoReturn

# Other launchers' options that users type out of habit, and what ddpboot calls them (keys with dashes).
FOREIGN_OPTIONS = {
    "-np": "mpirun's -np is --nproc N here (the ranks on this node, e.g. --nproc 2)",
    "-n": "mpirun's and srun's -n is --nproc N here (the ranks on this node, e.g. --nproc 2)",
    "--np": "mpirun's -np is --nproc N here (the ranks on this node, e.g. --nproc 2)",
    "--ntasks": "srun's --ntasks is --nproc N here (ranks per node, with --nnodes for several nodes)",
    "--num-gpus": "DeepSpeed's --num_gpus is --nproc N here (or --gpus LIST for given GPUs)",
    "--include": "DeepSpeed's --include is --gpus LIST here (and its --exclude is --exclude LIST)",
    "--num-processes": "accelerate's --num_processes is --nproc N here",
    "--gpu-ids": "accelerate's --gpu_ids is --gpus LIST here",
    "--use-env": "torch.distributed.launch's --use_env is what ddpboot always does (LOCAL_RANK is in each "
    "worker's environment): drop it",
}


def main(argv: list[str] | None = None) -> NoReturn:
    """A tool when the first argument names one, else a job. Each side imports only what it needs. A mistyped
    option or value is one `ddpboot: error:` line (exit 2), as every other error a user can make."""
    from typer import Abort
    from typer._click import exceptions  # the click that typer carries (its own copy)

    from ddpboot.cli.tools import TOOLS

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] not in TOOLS:
        _refuse_mistyped_tool(args[0])
    if args and args[0] in TOOLS:
        from ddpboot.cli.tools import tools as command

        prog = f"ddpboot {args[0]}"
    else:
        from ddpboot.cli.run import run_app as command

        prog = "ddpboot"
    from typer.main import get_command

    from ddpboot.cli import coercion
    from ddpboot.cli import help as cli_help

    coercion.install()  # no pydantic for the values whose coercion is known

    click_command = get_command(command)
    cli_help.install(click_command, brief="--help" not in args)  # -h (or nothing): the summary
    try:
        code = click_command.main(args, prog_name="ddpboot", standalone_mode=False)
    except exceptions.NoArgsIsHelpError as exc:  # bare `ddpboot`: typer has shown the help already
        sys.exit(exc.exit_code)
    except exceptions.ClickException as exc:
        from ddpboot.cli.output import fail_now

        fail_now(f"{_explain(exc, args).rstrip('.')}. Run `{prog} -h` for the options.", exc.exit_code)
    except Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    code = code if isinstance(code, int) else 0
    if argv is None and prog == "ddpboot":
        _job_ended(code)
    sys.exit(code)


def _job_ended(code: int) -> None:
    """The `ddpboot` command (a job) has ended and let go of everything it took (run directory, locks, sockets, its
    guardian): exit now, without the interpreter's teardown of every module (tens of ms on a small machine, paid
    after the last rank is gone). Where the output cannot be flushed, Python's own exit says so, as before."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def _refuse_mistyped_tool(first: str) -> None:
    """`ddpboot plans`, `ddpboot help`, `ddpboot version`: a first word that is no file but looks like a subcommand
    (or asks for help or the version) is answered with the command meant, not with "the script does not exist"."""
    import difflib
    import os

    from ddpboot.cli.tools import TOOLS

    if first.startswith("-") or os.path.exists(first):
        return
    meant = {"help": "ddpboot -h", "version": "ddpboot --version"}.get(first)
    close = difflib.get_close_matches(first, TOOLS, n=1, cutoff=0.6)
    if meant is None and close:
        meant = f"ddpboot {close[0]}"
    if meant is not None:
        from ddpboot.cli.output import fail_now

        fail_now(f"{first!r} is neither a subcommand nor a script here. Did you mean `{meant}`? The subcommands are "
                 f"{', '.join(TOOLS)}; anything else is the script to run.")


def _explain(exc: Exception, args: list[str]) -> str:
    """A click error as ddpboot says it: another launcher's option (mpirun's `-np 2`, which click reads as `-n`)
    is named as typed with ddpboot's own, and a list split by a space after its comma (`--checks a, b`) is
    named as such."""
    import itertools

    message: str = exc.format_message()  # type: ignore[attr-defined]
    option = getattr(exc, "option_name", None)
    if option:
        for arg in args:
            typed = arg.split("=", 1)[0]
            if not typed.startswith(option):
                continue
            key = "-np" if typed.startswith("-np") else typed.replace("_", "-")
            if key in FOREIGN_OPTIONS:
                return f"No such option: {typed}. {FOREIGN_OPTIONS[key]}"
    if message.startswith("Got unexpected extra argument"):
        for before, after in itertools.pairwise(args):
            if before.endswith(",") and after in message:
                return (f"{message.rstrip('.')}: {before} {after} is one list split by a space; write it without "
                        f"spaces ({before}{after}) or quote it")
    return message
