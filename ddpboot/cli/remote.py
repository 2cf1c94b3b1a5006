"""`python -m ddpboot.cli.remote ARGS`: the launcher of one host of a job that `ddpboot --hostfile FILE` (or
`--hosts`) started over ssh (launch/remote.py), or directly on the launching host when it is one of the hosts.

It reads the launching host's hello from its stdin (its ddpboot version and the variables the job forwards),
refuses a ddpboot of another version (the two ends speak one protocol), puts the variables into its environment,
forks its tether (launch/tether.py: the launching host's signals, and the end of the connection, reach the
launcher through it), and then is `ddpboot ARGS`, as typed on that host.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import NoReturn


def main() -> NoReturn:
    from ddpboot.cli.app import main as ddpboot_main
    from ddpboot.cli.output import fail_now
    from ddpboot.errors import UsageError
    from ddpboot.launch import tether

    try:
        hello, rest = tether.read_hello()
    except UsageError as exc:
        fail_now(str(exc))
    mine = importlib.import_module("ddpboot").__version__
    if hello.get("version") != mine:
        fail_now(f"this host's ddpboot ({sys.executable}) is version {mine}, the launching host's "
                 f"{hello.get('version')}: install the same ddpboot at the same path on every host.")
    os.environ.update({str(k): str(v) for k, v in hello["env"].items()})
    tether.start(rest)
    ddpboot_main(sys.argv[1:])


if __name__ == "__main__":
    main()
