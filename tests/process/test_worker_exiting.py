"""The worker's exit path at a real interpreter exit (ddpboot/worker/exiting.py): whether the script leaves with a
failure, as an atexit handler sees it, for each way a script can end."""

from __future__ import annotations

import subprocess
import sys

import pytest

LEAVING = """
import atexit, sys, threading
from ddpboot.worker import exiting
exiting.RECORDER.install()
atexit.register(lambda: print("failing" if exiting.leaving_with_failure() else "clean"))
{body}
"""
ENDINGS = [
    ("pass", "clean"),
    ("sys.exit(0)", "clean"),
    ("sys.exit()", "clean"),
    ("sys.exit(2)", "failing"),
    ("raise ValueError('x')", "failing"),
    ("raise KeyboardInterrupt", "failing"),
    ("exit(5)", "failing"),
    ("t = threading.Thread(target=sys.exit, args=(3,)); t.start(); t.join()", "clean"),
]


@pytest.fixture(scope="module")
def ended() -> dict[str, tuple[str, str]]:
    """Each ending's interpreter, all started at once (each imports torch): body -> (stdout, stderr)."""
    procs = {body: subprocess.Popen([sys.executable, "-c", LEAVING.format(body=body)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for body, _ in ENDINGS}
    try:
        return {body: proc.communicate(timeout=120) for body, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.parametrize(("body", "verdict"), ENDINGS)
def test_leaving_with_failure_at_interpreter_exit(body: str, verdict: str, ended: dict[str, tuple[str, str]]) -> None:
    out, err = ended[body]
    assert out.strip().splitlines()[-1] == verdict, err
