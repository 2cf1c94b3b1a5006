"""Every `console` block of the README and docs/ is run, so the documentation cannot rot.

A `$ command` line is run with bash in the repository root on a simulated 8-GPU machine (unless the command sets
DDPBOOT_FAKE_GPUS itself), at 80 columns, on CPU cores 0 and 1 (the plan's `cores` column): what the docs show is
what a reader gets. The lines after it, up to the next `$`, are what it must print:

- none: the command must exit 0 (a list of commands to type, output not shown);
- a line that starts with `ddpboot: error:`: exit code 2 and a message on stderr that begins with that text;
- otherwise exit 0 and exactly these lines on stdout, the whole output (trailing blanks of a line aside), unless
  the block marks what it leaves out with a line `…`: then each shown line must appear, in this order (white space
  folded).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO, clean_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
CUT = "…"
CORES = {0, 1}


@dataclass
class Example:
    where: str
    command: str
    expected: list[str]

    @property
    def excerpt(self) -> bool:
        return CUT in (line.strip() for line in self.expected)


def examples() -> list[Example]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _BLOCK.finditer(text):
            line_no = text[: m.start()].count("\n") + 2
            current: Example | None = None
            for i, line in enumerate(m.group(1).splitlines()):
                if line.startswith("$ "):
                    current = Example(f"{doc.relative_to(REPO)}:{line_no + i}", line[2:], [])
                    out.append(current)
                elif current is not None:
                    current.expected.append(line.rstrip())
    for example in out:
        while example.expected and not example.expected[-1]:
            example.expected.pop()
    return out


def fold(text: str) -> str:
    return " ".join(text.split())


@functools.cache
def run(command: str) -> subprocess.CompletedProcess[str]:
    """The command's outcome (a command shown in two places runs once; each place checks what it shows)."""
    env = clean_env(DDPBOOT_FAKE_GPUS="8", COLUMNS="80")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.sched_setaffinity(0, CORES))


def lines_of(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def in_order(expected: list[str], output: str) -> str | None:
    """The first shown line of an excerpt that the output lacks (after the lines before it), None if none."""
    rest = fold(output)
    for line in expected:
        if line.strip() in ("", CUT):
            continue
        at = rest.find(fold(line))
        if at < 0:
            return line
        rest = rest[at + len(fold(line)) :]
    return None


@pytest.mark.skipif(not CORES.issubset(os.sched_getaffinity(0)), reason="the docs show plans made on CPU cores 0 and 1")
@pytest.mark.parametrize("example", examples(), ids=lambda e: e.where)
def test_documented_command(example: Example) -> None:
    out = run(example.command)
    errors = [e for e in example.expected if e.startswith("ddpboot: error:")]
    if errors:
        assert out.returncode == 2, f"{example.command}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
        assert fold(out.stderr).startswith(fold(errors[0])), out.stderr
        return
    assert out.returncode == 0, f"{example.command}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    if example.excerpt:
        missing = in_order(example.expected, out.stdout)
        assert missing is None, f"{example.command}: missing {missing!r} (in this order) in\n{out.stdout}"
    elif example.expected:
        assert lines_of(out.stdout) == example.expected, f"{example.command}: prints\n{out.stdout}"


def test_the_docs_have_examples() -> None:
    assert len(examples()) >= 10
    assert sum(1 for e in examples() if e.expected and not e.excerpt and not e.expected[0].startswith("ddpboot:")) >= 3


def test_a_shown_output_is_the_whole_output() -> None:
    """A block that shows two of four rows fails: the output is compared whole unless the block says `…`."""
    whole = Example("t", "DDPBOOT_FAKE_GPUS=8 ddpboot plan --nproc 4 --exclude 0", [])
    out = run(whole.command).stdout
    rows = [line for line in lines_of(out) if "cuda:0 = GPU" in line]
    assert len(rows) == 4 and lines_of(out) != rows[::3]
    assert in_order(rows[::3], out) is None and in_order(rows[::-3], out) == rows[0]
