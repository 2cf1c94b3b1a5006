"""The entry point: `ddpboot plan|gpus|smoke ...` runs a tool, anything else is a job (`ddpboot [OPTIONS] SCRIPT`)."""

from __future__ import annotations

import sys

TOOLS = ("plan", "gpus", "smoke")


def main(argv: list[str] | None = None) -> None:
    """A tool when the first argument names one, else a job. Each side imports only what it needs."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in TOOLS:
        from ddpboot.cli.tools import tools

        tools(args, prog_name="ddpboot")
    else:
        from ddpboot.cli.run import run_app

        run_app(args, prog_name="ddpboot")
