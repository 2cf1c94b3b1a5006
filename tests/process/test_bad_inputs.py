"""The bad-input sweep: every odd or wrong input a new user might type, kept as a table (bad_inputs.tsv).

Each case is a shell command line in a scratch directory holding `mark.py`, a script that writes one marker file per
rank that runs. The `expect` column says what must happen:

    error    exit 2, exactly one `ddpboot: error:` line on stderr, no traceback, and no marker: nothing started
    prints   exit 0 and no marker: a tool, help, --version or a dry run answered without starting workers
    runs     exit 0 and a marker per rank: running is the documented meaning (e.g. CUDA_VISIBLE_DEVICES='' means
             CPU ranks on purpose)
    passes   exit 0 and no marker: a smoke test that ran its ranks and passed
    fails    the script itself ran and failed (exit 1), as `python script.py` would

`error` and `prints` cases run through `ddpboot.cli.main` in this process (the shell expands the line first), with
the worker start replaced by a failure, so that the sweep stays fast and a case that would start workers is
caught; `runs` and `fails` cases start real workers in a subprocess.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import clean_env, ddpboot_exe

TABLE = Path(__file__).with_name("bad_inputs.tsv")
MARK = """\
import os, sys
from pathlib import Path
rank = os.environ.get("RANK", "0")
Path(os.environ["MARK_DIR"], f"rank{rank}").write_text(" ".join(sys.argv[1:]))
print(f"MARK rank {rank} argv {sys.argv[1:]}")
"""


@dataclass(frozen=True)
class Case:
    name: str
    command: str
    expect: str


def cases() -> list[Case]:
    with TABLE.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Case(r["case"], r["command"], r["expect"]) for r in rows]


class Started(Exception):
    """A case expected to start nothing reached the worker start."""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The scratch directory every case runs in, with the files the table's commands name."""
    work = tmp_path_factory.mktemp("bad-inputs")
    (work / "mark.py").write_text(MARK)
    (work / "syntaxerr.py").write_text("def broken(:\n")
    (work / "notexec.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "adir").mkdir()
    (work / "afile").write_text("a file, not a directory\n")
    (work / "bad.json").write_text("[{not json")
    (work / "wrong.json").write_text(json.dumps([{"name": 3, "memory_total": "lots"}]))
    (work / "obj.json").write_text(json.dumps({"gpus": [{"name": "Simulated GPU", "memory_total": 2**34}]}))
    (work / "emptylist.json").write_text("[]")
    (work / "weird.json").write_text(json.dumps([1, 2, 3]))
    yield work


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    """Two ports in use while the sweep runs: one on loopback, one on every address."""
    loopback, anywhere = socket.socket(), socket.socket()
    loopback.bind(("127.0.0.1", 0))
    anywhere.bind(("0.0.0.0", 0))
    loopback.listen()
    anywhere.listen()
    yield {"PORT_IN_USE": str(loopback.getsockname()[1]), "PORT_IN_USE_ANY": str(anywhere.getsockname()[1])}
    loopback.close()
    anywhere.close()


def expand(command: str, work: Path, ports: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The case's variable assignments and ddpboot's arguments, as bash expands the line."""
    values = {"WORKDIR": str(work), **ports}
    for key, value in sorted(values.items(), key=lambda kv: -len(kv[0])):  # PORT_IN_USE_ANY before PORT_IN_USE
        command = command.replace(key, value)
    probe = "ddpboot() { printf '%s\\0' \"$@\"; printf '\\1\\0'; env -0; }; " + command
    out = subprocess.run(["bash", "-c", probe], env=clean_env(), cwd=work, capture_output=True, check=True).stdout
    parts = out.decode().split("\0")
    split = parts.index("\1")
    args, env_lines = parts[:split], [p for p in parts[split + 1 :] if "=" in p]
    return dict(line.split("=", 1) for line in env_lines), args


def in_process(
    env: dict[str, str], args: list[str], work: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """ddpboot.cli.main(args) here, under `env` in `work`, with anything that would start workers made to fail."""
    from ddpboot import smoke
    from ddpboot.cli import main
    from ddpboot.launch import runner
    from ddpboot.launch.supervisor import Supervisor

    def started(*_args: object, **_kwargs: object) -> None:
        raise Started

    monkeypatch.setattr(Supervisor, "run", started)
    monkeypatch.setattr(smoke, "run_smoke", started)
    monkeypatch.setattr(runner, "block_early", lambda signals: None)  # the test process keeps its signals
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(work)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(args)
        except SystemExit as done:
            code = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
        except Started:
            code = -1
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_bad_input(case: Case, workdir: Path, ports: dict[str, str], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    env, args = expand(case.command, workdir, ports)
    env["MARK_DIR"] = str(tmp_path)
    env.setdefault("COLUMNS", "120")
    if case.expect in ("error", "prints"):
        code, out, err = in_process(env, args, workdir, monkeypatch)
    else:
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        done = subprocess.run([*ddpboot_exe(), *args], env=env, cwd=workdir, capture_output=True, text=True,
                              timeout=120)
        code, out, err = done.returncode, done.stdout, done.stderr
    marks = sorted(p.name for p in tmp_path.iterdir())
    said = f"{case.command}\nexit {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert code != -1, f"reached the worker start:\n{said}"
    if case.expect == "error":
        assert code == 2, said
        errors = [line for line in err.splitlines() if line.startswith("ddpboot: error:")]
        assert len(errors) == 1 and len(errors[0]) > len("ddpboot: error: ") + 10, said
        assert "Traceback" not in err and not marks, said
    elif case.expect == "prints":
        assert code == 0 and not marks and "Traceback" not in err, said
    elif case.expect == "runs":
        assert code == 0 and marks, said
    elif case.expect == "passes":
        assert code == 0 and not marks, said
    else:
        assert case.expect == "fails", case
        assert code == 1 and not marks and "Traceback" not in err.split("[rank")[0], said


def test_the_table_covers_the_sweep() -> None:
    names = [c.name for c in cases()]
    assert len(names) >= 151 and len(set(names)) == len(names)
    assert {c.expect for c in cases()} <= {"error", "prints", "runs", "passes", "fails"}
