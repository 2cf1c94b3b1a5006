"""What a new user meets first: the README's quick start, run as written on machines with 0, 1, 2 and 8 GPUs.

The quick start is the README's first `console` block after its "Quick start" heading; each `$` line is run with
bash in the repository root on a simulated machine (DDPBOOT_FAKE_GPUS=0 is a machine without GPUs) and must exit 0.
The lines that read the inventory run on every machine; the `--cpu` jobs, whose ranks never use a GPU, run on the
machines without GPUs and with eight (on one and two they would repeat the same CPU jobs).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, clean_env


def quick_start() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quick start") :]
    block = re.search(r"^```console\n(.*?)^```", section, re.S | re.M)
    assert block, "the README's quick start has no console block"
    return [line[2:] for line in block.group(1).splitlines() if line.startswith("$ ")]


def test_the_quick_start_is_a_few_commands() -> None:
    commands = quick_start()
    assert 3 <= len(commands) <= 6 and all(c.startswith("ddpboot") for c in commands)


@pytest.mark.parametrize("gpus", ["0", "1", "2", "8"])
def test_the_quick_start_runs_as_written(gpus: str) -> None:
    env = clean_env(DDPBOOT_FAKE_GPUS=gpus, COLUMNS="100")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    commands = quick_start()
    if gpus in ("1", "2"):
        commands = [c for c in commands if "--cpu" not in c.split()]
        assert commands, "the quick start has no line that reads the inventory"
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{gpus} GPUs: {command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
