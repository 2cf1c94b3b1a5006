"""The entry point: `ddpboot plan|gpus|smoke ...` runs a tool, anything else is a job (`ddpboot [OPTIONS] SCRIPT`)."""

from __future__ import annotations

import sys
from typing import NoReturn

TOOLS = ("plan", "gpus", "smoke", "stacks")


def main(argv: list[str] | None = None) -> NoReturn:
    """A tool when the first argument names one, else a job. Each side imports only what it needs. A mistyped
    option or value is one `ddpboot: error:` line (exit 2), as every other error a user can make."""
    from typer import Abort
    from typer._click import exceptions  # the click that typer carries (its own copy)

    args = sys.argv[1:] if argv is None else argv
    if args and args[0] not in TOOLS:
        _refuse_mistyped_tool(args[0])
    if args and args[0] in TOOLS:
        from ddpboot.cli.tools import tools as command

        prog = f"ddpboot {args[0]}"
    else:
        from ddpboot.cli.run import run_app as command

        prog = "ddpboot"
    try:
        code = command(args, prog_name="ddpboot", standalone_mode=False)
    except exceptions.NoArgsIsHelpError as exc:  # bare `ddpboot`: typer has shown the help already
        sys.exit(exc.exit_code)
    except exceptions.ClickException as exc:
        from ddpboot.cli.output import fail_now

        fail_now(f"{exc.format_message().rstrip('.')}. Run `{prog} -h` for the options.", exc.exit_code)
    except Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _refuse_mistyped_tool(first: str) -> None:
    """`ddpboot plans`, `ddpboot help`, `ddpboot version`: a first word that is no file but looks like a subcommand
    (or asks for help or the version) is answered with the command meant, not with "the script does not exist"."""
    import difflib
    import os

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
