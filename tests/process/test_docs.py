"""Every `console` block of the README and docs/ is run, so the documentation cannot rot.

A `$ command` line is run with bash in the repository root on a simulated 8-GPU machine (unless the command sets
DDPBOOT_FAKE_GPUS itself). The lines after it, up to the next `$`, are what it must print: an expected line that
starts with `ddpboot: error:` means exit code 2 and an error message that begins with that text; otherwise the
command must exit 0 and print every expected line (white space folded).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO, clean_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


@dataclass
class Example:
    where: str
    command: str
    expected: list[str]


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
                elif current is not None and line.strip():
                    current.expected.append(line)
    return out


def fold(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.where)
def test_documented_command(example: Example) -> None:
    env = clean_env(DDPBOOT_FAKE_GPUS="8", COLUMNS="200")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    out = subprocess.run(["bash", "-c", example.command], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    errors = [e for e in example.expected if e.startswith("ddpboot: error:")]
    if errors:
        assert out.returncode == 2, f"{example.command}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
        assert fold(out.stderr).startswith(fold(errors[0])), out.stderr
        return
    assert out.returncode == 0, f"{example.command}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    for line in example.expected:
        assert fold(line) in fold(out.stdout), f"{example.command}: missing {line!r} in\n{out.stdout}"


def test_the_docs_have_examples() -> None:
    assert len(examples()) >= 10
