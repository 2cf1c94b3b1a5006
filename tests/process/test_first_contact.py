"""What a new user meets first: the README's quick start, run as written on machines with 0, 1, 2 and 8 GPUs.

The quick start is the README's first `console` block after its "Quick start" heading; each `$` line is run with
bash in the repository root on a simulated machine (DDPBOOT_FAKE_GPUS=0 is a machine without GPUs) and must exit 0.
The lines that read the inventory run on every machine; the `--cpu` jobs, whose ranks never use a GPU, run here on
the machine without GPUs (on one, two and eight they would repeat the same CPU jobs: tests/process/test_docs.py runs
every line of the block on the simulated 8-GPU machine). A command already run on the same machine in this module is
not run again: its outcome is checked by each test that names it.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, clean_env


@functools.cache
def run_as_written(command: str, gpus: str) -> subprocess.CompletedProcess[str]:
    """`command` run with bash in the repository root on a simulated machine with `gpus` GPUs, at 100 columns."""
    env = clean_env(DDPBOOT_FAKE_GPUS=gpus, COLUMNS="100")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def quick_start(doc: str = "README.md", which: int = 0) -> list[str]:
    """The commands of the `which`-th console block after the document's "Quick start" heading."""
    text = (REPO / doc).read_text()
    section = text[text.index("## Quick start") :]
    blocks = re.findall(r"^```console\n(.*?)^```", section.split("\n## ", 1)[0], re.S | re.M)
    assert len(blocks) > which, f"{doc}'s quick start has no console block {which}"
    return [line[2:] for line in blocks[which].splitlines() if line.startswith("$ ")]


def test_the_quick_start_is_a_few_commands() -> None:
    commands = quick_start()
    assert 3 <= len(commands) <= 6 and all(c.startswith("ddpboot") for c in commands)


@pytest.mark.parametrize("gpus", ["0", "1", "2", "8"])
def test_the_quick_start_runs_as_written(gpus: str) -> None:
    commands = quick_start()
    if gpus != "0":
        commands = [c for c in commands if "--cpu" not in c.split()]
        assert commands, "the quick start has no line that reads the inventory"
    for command in commands:
        done = run_as_written(command, gpus)
        assert done.returncode == 0, f"{gpus} GPUs: {command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def test_the_guides_quick_start_runs_first_on_a_machine_without_gpus() -> None:
    """guide.md shows the --cpu form first: it runs without GPUs as written; the GPU form after it says so there
    (one line, exit 2, naming --cpu), as the guide announces."""
    first, then = quick_start("docs/guide.md", 0), quick_start("docs/guide.md", 1)
    assert first and all("--cpu" in c.split() for c in first) and any("--exclude" in c for c in then)
    for command, code in [*((c, 0) for c in first), *((c, 2) for c in then)]:
        done = run_as_written(command, "0")
        assert done.returncode == code, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        if code == 2:
            assert "this machine has no GPUs" in done.stderr and "--cpu" in done.stderr, done.stderr
