"""The rank bootstrap (ddpboot/launch/bootstrap.py) against plain python: tests/process/scripts/boot_probe.py run
as `python -u SCRIPT` / `python -u -m MODULE` and as the launcher runs a rank must print the same (argv, orig_argv,
sys.path[0], __main__'s names, pickling a class of the script, a spawn pool, signal dispositions, the traceback of
an uncaught exception, atexit and threads at the end; a directory or zip file with a __main__.py; -P) and exit alike;
and the bootstrap's faulthandler writes the rank's stack on the stacks signal. test_fast_start.py compares a rank
forked by the fast-start process with plain python the same way (launch/pymain.py runs the target for both).
Standard library processes only: each run takes a fraction of a second."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ddpboot.contract import RANK_STACKS_SIGNAL, STACKS_VAR, stacks_spec
from ddpboot.launch.bootstrap import rank_command
from tests.support import SCRIPTS

PROBE = SCRIPTS / "boot_probe.py"


def run(argv: list[str], cwd: Path, stacks: Path, carrier: dict[str, str] | None = None,
        **extra: str) -> tuple[int, str, str]:
    env = {**os.environ, STACKS_VAR: stacks_spec(RANK_STACKS_SIGNAL, str(stacks)), **(carrier or {}), **extra}
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def both(kind: str, name: str, args: list[str], cwd: Path, tmp_path: Path,
         **extra: str) -> tuple[tuple[int, str, str], ...]:
    plain = [sys.executable, "-u", name, *args] if kind == "script" else [sys.executable, "-u", "-m", name, *args]
    return (run(plain, cwd, tmp_path / "plain.stacks", **extra),
            run(*boot(kind, name, args, cwd, tmp_path / "boot.stacks"), **extra))


def boot(kind: str, name: str, args: list[str], cwd: Path, stacks: Path
         ) -> tuple[list[str], Path, Path, dict[str, str]]:
    """run()'s arguments for `name` run through the rank bootstrap, as the launcher execs a rank."""
    argv, carrier = rank_command(sys.executable, kind, name, args)
    return argv, cwd, stacks, carrier


CASES = {
    "report": (["report"], 0),
    "exit": (["exit", "7"], 7),
    "raise": (["raise"], 1),
    "interrupt": (["interrupt"], -2),
    "late": (["late"], 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_script_runs_as_under_plain_python(case: str, tmp_path: Path) -> None:
    args, code = CASES[case]
    link = tmp_path / "link.py"  # a relative, symlinked path: sys.path[0] is the real directory, __file__ the link
    link.symlink_to(PROBE)
    plain, boot = both("script", "link.py", args, tmp_path, tmp_path)
    assert plain[0] == code, plain
    assert boot == plain
    if case == "report":
        assert f'"path0": "{SCRIPTS}"' in boot[1] and '"pickle_module": "__main__"' in boot[1]
    if case == "raise":
        assert boot[2].startswith("Traceback (most recent call last):\n  File ") and "<string>" not in boot[2]


@pytest.mark.parametrize("case", ["report", "raise"])
def test_a_module_runs_as_under_python_m(case: str, tmp_path: Path) -> None:
    plain, boot = both("module", "boot_probe", CASES[case][0], SCRIPTS, tmp_path)
    assert plain[0] == CASES[case][1], plain
    assert boot == plain


@pytest.mark.parametrize("app", ["app", "app.zip"])
def test_a_directory_or_a_zip_file_runs_its_main_as_under_plain_python(app: str, tmp_path: Path) -> None:
    main = "import sys; print(sys.argv, sys.path[:2], __file__, __name__, type(__loader__).__name__)\n"
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(main)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", main)
    for safe in ("", "1"):  # PYTHONSAFEPATH=1 (python -P) prepends the directory or zip file all the same
        plain, boot = both("script", app, ["x"], tmp_path, tmp_path, PYTHONSAFEPATH=safe)
        assert plain[0] == 0 and f"{app}/__main__.py __main__" in plain[1], plain
        assert boot == plain


@pytest.mark.parametrize("kind", ["script", "module"])
def test_without_the_scripts_directory_on_the_path_as_under_python_p(kind: str, tmp_path: Path) -> None:
    """PYTHONSAFEPATH=1 (python -P): no sys.path[0] is prepended for a script or a module (which the current
    directory then does not provide)."""
    name = "boot_probe" if kind == "module" else str(PROBE)
    plain, boot = both(kind, name, ["report"], SCRIPTS, tmp_path, PYTHONSAFEPATH="1")
    assert plain[0] == (1 if kind == "module" else 0), plain
    assert boot == plain


def test_a_syntax_error_reads_as_under_plain_python(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("x = (\n")
    plain, boot = both("script", "broken.py", [], tmp_path, tmp_path)
    assert plain[0] == 1 and "SyntaxError" in plain[2]
    assert boot == plain


def test_the_bootstrap_registers_faulthandler_on_the_stacks_signal(tmp_path: Path) -> None:
    code, out, err = run(*boot("script", str(PROBE), ["stacks"], tmp_path, tmp_path / "s"))
    assert (code, out) == (0, "still running\n"), err
    text = (tmp_path / "s").read_text()
    assert text.startswith("Current thread 0x") and f'File "{PROBE}", line ' in text


def test_without_the_variable_the_bootstrap_registers_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != STACKS_VAR}
    code = "import sys; print(int(open('/proc/self/status').read().split('SigCgt:')[1].split()[0], 16) >> %d & 1)"
    (tmp_path / "sig.py").write_text(code % (RANK_STACKS_SIGNAL - 1) + "\n")
    argv, carrier = rank_command(sys.executable, "script", "sig.py", [])
    p = subprocess.run(argv, cwd=tmp_path, env={**env, **carrier}, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (0, "0\n"), p.stderr


def test_the_rank_shows_its_script_and_keeps_the_bootstrap_to_itself(tmp_path: Path) -> None:
    """The command line (what ps, top and py-spy show) is short and names the script; the variable that carried the
    bootstrap is gone from the script's environment and its children's, as under plain python."""
    (tmp_path / "show.py").write_text(
        "import os, subprocess, sys\n"
        "print(open('/proc/self/cmdline', 'rb').read().hex())\n"
        "print(os.environ.get('DDPBOOT_BOOTSTRAP'))\n"
        "subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"DDPBOOT_BOOTSTRAP\"))'])\n")
    code, out, err = run(*boot("script", "show.py", ["--lr", "3"], tmp_path, tmp_path / "s"))
    cmdline, mine, child = out.splitlines()
    shown = bytes.fromhex(cmdline)
    assert code == 0 and (mine, child) == ("None", "None"), err
    assert len(shown) <= 200 and shown.split(b"\0")[-4:] == [b"show.py", b"--lr", b"3", b""], shown
