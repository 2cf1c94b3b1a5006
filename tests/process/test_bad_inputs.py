"""The bad-input sweep: every odd or wrong input a new user might type, kept as a table (bad_inputs.tsv).

Each case is a shell command line in a scratch directory holding `mark.py`, a script that writes one marker file per
rank that runs. The `expect` column says what must happen:

    error    exit 2, exactly one `ddpboot: error:` line on stderr, no traceback, and no marker: nothing started
    prints   exit 0 and no marker: a tool, help, --version or a dry run answered without starting workers
    runs     exit 0 and a marker per rank: running is the documented meaning (e.g. CUDA_VISIBLE_DEVICES='' means
             CPU ranks on purpose)
    passes   exit 0 and no marker: a smoke test that ran its ranks and passed
    fails    the script itself ran and failed (exit 1), as `python script.py` would
    exit N   the job ran and ended with exit code N (its failing rank's, or the shell's), and no line of stderr
             is a traceback of the launcher's own (a rank's are prefixed `[rankG]: `)

`error` and `prints` cases run through `ddpboot.cli.main` in this process (the shell expands the line first), with
the worker start replaced by a failure, so that the sweep stays fast and a case that would start workers is
caught; `runs`, `fails` and `exit N` cases start real workers in a subprocess. A case whose `shell` column says
`yes` is the user's whole shell line (pipes, redirections, `ulimit`, `setpriv`, `cd`, several commands), run by bash
with the installed `ddpboot` on PATH; its exit status is the line's, and no line of its stderr may be a launcher's
traceback whatever it expects.
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
    shell: bool = False


def cases() -> list[Case]:
    with TABLE.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Case(r["case"], r["command"], r["expect"], (r.get("shell") or "") == "yes") for r in rows]


# The scripts and files the table's commands name, besides mark.py.
FILES = {
    "fail0.py": "import os\nif os.environ['RANK'] == '0':\n    raise RuntimeError('rank 0 fails')\n",
    "fail1.py": "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 fails')\n",
    "exit3.py": "import os, sys\nif os.environ['RANK'] == '1':\n    sys.exit(3)\n",
    "sysexit_text.py": "import os, sys\nif os.environ['RANK'] == '1':\n"
                       "    sys.exit('fatal: config file /etc/train.yaml missing')\n",
    "osexit.py": "import os, time\nif os.environ['RANK'] == '1':\n    print('rank 1 calling os._exit(7)', flush=True)\n"
                 "    os._exit(7)\ntime.sleep(60)\n",
    "kbint.py": "import os\nif os.environ['RANK'] == '0':\n    raise KeyboardInterrupt\n",
    "spam.py": "import itertools\nfor i in itertools.count():\n    print(f'line {i} ' + 'x' * 100)\n",
    "many.py": "import os\nfor i in range(2000):\n    print(f'rank {os.environ[\"RANK\"]} step {i}', flush=True)\n",
    "bigline.py": "import os, sys\nif os.environ['RANK'] == '0':\n    sys.stdout.write('x' * 10_000_000)\n"
                  "else:\n    print('rank 1 short line')\n",
    "nonutf8.py": "import sys\nsys.stdout.buffer.write(b'caf\\xe9 \\xff\\xfe bytes\\n')\n"
                  "sys.stderr.buffer.write(b'\\x80\\x81\\n')\n",
    "ask.py": "import os\ntry:\n    line = input()\nexcept EOFError:\n    line = None\n"
              "print(f'rank {os.environ[\"RANK\"]} read {line!r}')\n",
    "bgchild.py": "import subprocess\nsubprocess.Popen(['sleep', '45'])\nprint('a background sleep, and exit 0')\n",
    "ignterm.py": "import os, signal, sys, time\nif os.environ['RANK'] == '0':\n"
                  "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    time.sleep(60)\n"
                  "time.sleep(0.5)\nsys.exit(4)\n",
    "sleep20.py": "import time\ntime.sleep(20)\n",
    "pkg_nomain/__init__.py": "",
    "dupuuid.json": json.dumps([{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "memory_total": 2**34}] * 2),
}


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
    for name, text in FILES.items():
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_text(text)
    yield work


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    """Two ports in use while the sweep runs: one on loopback, one on every address; and one free (FREE_PORT)."""
    loopback, anywhere, free = socket.socket(), socket.socket(), socket.socket()
    loopback.bind(("127.0.0.1", 0))
    anywhere.bind(("0.0.0.0", 0))
    free.bind(("127.0.0.1", 0))
    loopback.listen()
    anywhere.listen()
    free_port = str(free.getsockname()[1])
    free.close()
    yield {"PORT_IN_USE": str(loopback.getsockname()[1]), "PORT_IN_USE_ANY": str(anywhere.getsockname()[1]),
           "FREE_PORT": free_port}
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


def in_shell(case: Case, work: Path, ports: dict[str, str], marks: Path) -> tuple[int, str, str]:
    """The case's whole line, run by bash in `work` with the installed ddpboot (and this python) first on PATH."""
    command = case.command
    for key, value in sorted({"WORKDIR": str(work), **ports}.items(), key=lambda kv: -len(kv[0])):
        command = command.replace(key, value)
    env = clean_env(MARK_DIR=str(marks), COLUMNS="120")
    env["PATH"] = f"{Path(ddpboot_exe()[0]).parent}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", command], env=env, cwd=work, capture_output=True, text=True, timeout=120,
                          errors="replace")
    return done.returncode, done.stdout, done.stderr


def launcher_traceback(err: str) -> bool:
    """A traceback of the launcher's own: a line that starts with it (a rank's lines carry their prefix)."""
    return any(line.startswith("Traceback (most recent call last)") for line in err.splitlines())


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_bad_input(case: Case, workdir: Path, ports: dict[str, str], tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    if case.shell:
        code, out, err = in_shell(case, workdir, ports, tmp_path)
    else:
        env, args = expand(case.command, workdir, ports)
        env["MARK_DIR"] = str(tmp_path)
        env.setdefault("COLUMNS", "120")
        if case.expect in ("error", "prints"):
            code, out, err = in_process(env, args, workdir, monkeypatch)
        else:
            env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
            done = subprocess.run([*ddpboot_exe(), *args], env=env, cwd=workdir, capture_output=True, text=True,
                                  timeout=120, errors="replace")
            code, out, err = done.returncode, done.stdout, done.stderr
    marks = sorted(p.name for p in tmp_path.iterdir())
    said = f"{case.command}\nexit {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert code != -1, f"reached the worker start:\n{said}"
    assert not (case.shell and launcher_traceback(err)), said
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
    elif case.expect.startswith("exit "):
        assert code == int(case.expect.split()[1]) and not launcher_traceback(err), said
    else:
        assert case.expect == "fails", case
        assert code == 1 and not marks and "Traceback" not in err.split("[rank")[0], said


def test_the_table_covers_the_sweep() -> None:
    names = [c.name for c in cases()]
    assert len(names) >= 151 and len(set(names)) == len(names)
    kinds = {c.expect for c in cases()}
    assert {k for k in kinds if not k.startswith("exit ")} <= {"error", "prints", "runs", "passes", "fails"}
    assert all(k.split()[1].isdigit() for k in kinds if k.startswith("exit "))
