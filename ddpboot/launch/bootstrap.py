"""How an exec'd Python rank starts: `python -u -c LAUNCH WORDS`, where WORDS are what python would be given after
`-u` (`train.py ARGS`, `-m pkg.train ARGS`: pymain.TargetKind.words), so that `ps`, top, htop, nvidia-smi and py-spy
show the rank as `python -u -c exec(...) train.py ARGS`, the script's name 63 characters after the interpreter's
path. LAUNCH takes the bootstrap from the rank's environment (BOOTSTRAP_VAR, removed there as it starts, so the
script and its children do not inherit it) and runs it: launch/pymain.py's source, run in a namespace of its own,
then `pymain.run_execd` (faulthandler on the stacks signal, contract.py STACKS_VAR, so that the launcher's stack
dumps read every rank without py-spy or ptrace; then the script exactly as `python -u SCRIPT ARGS`, `python -u -m
MODULE ARGS` or the `--run-path` runner would run it, as pymain.py's docstring says). The source is standard
library only and imports nothing of ddpboot, so it works with any PYTHON_EXEC interpreter (one without ddpboot
installed, one inside a container that cannot see the launcher's files). Pure.

What differs from plain python: a few frames below the script's in a live stack (py-spy, faulthandler: two of
`<string>`, then pymain.py's; the summary skips them), one open file (the stacks file, close-on-exec), the start-up
marks (pymain.py record_phases: a finder first in sys.meta_path until torch is imported, and torch.cuda._lazy_init
and init_process_group wrapped until their first call, one frame of pymain.py's below them then), and the
process's command line, which `--dry-run` and the failure report show as `python -u SCRIPT ARGS` (launch/env.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

from ddpboot.launch import pymain
from ddpboot.launch.pymain import TargetKind

BOOTSTRAP_VAR = "DDPBOOT_BOOTSTRAP"
LAUNCH = f'exec(__import__("os").environ.pop("{BOOTSTRAP_VAR}"))'
"""The `-c` code of every Python rank: it binds no name in `__main__` (`os` is not left behind)."""

PYMAIN = Path(pymain.__file__)


@cache
def bootstrap(kind: TargetKind) -> str:
    """The bootstrap LAUNCH runs, for a target of this kind: pymain.py's source, compiled under its file's name (the
    frames it adds read as pymain.py's, whichever way the rank started) and run in a namespace of its own, then its
    run_execd. It binds no name in `__main__` either."""
    source = PYMAIN.read_text(encoding="utf-8")
    return (f"# ddpboot rank bootstrap: launch/pymain.py, then run_execd({kind.value!r})\n"
            f"(lambda n: exec(compile({source!r}, {str(PYMAIN)!r}, 'exec'), n) or n['run_execd']({kind.value!r}))"
            "({'__name__': '__ddpboot_pymain__'})\n")


def rank_command(python: str, kind: str, name: str, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """A Python rank's command line (LAUNCH, then the words python would be given) and the variable that carries
    the bootstrap, for its environment."""
    of = TargetKind(kind)
    if not of.is_python:
        raise ValueError(f"not a Python target kind: {kind!r}")
    return [python, "-u", "-c", LAUNCH, *of.words(name, args)], {BOOTSTRAP_VAR: bootstrap(of)}
