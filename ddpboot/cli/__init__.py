"""The `ddpboot` command line: `ddpboot [OPTIONS] SCRIPT [ARGS...]` runs a job; `plan`, `gpus`, `smoke` are tools.

Errors a user can cause (DdpbootError) are printed as one paragraph without a traceback and exit 2; nothing has
been started then. Planning reads NVML only: the command line never imports torch. Only this package speaks typer,
click and rich; it parses every option once, into the typed values the layers below take.

    app.py      main(): a tool or a job
    tools.py    plan, gpus, smoke            run.py, run_options.py   the job command and its options
    options.py  the shared selection options, which options were given
    render.py   tables and dry-run output    output.py                consoles, errors as messages
"""

from __future__ import annotations

from ddpboot.cli.app import main

__all__ = ["main"]
