"""The user's environment, met by a real launcher: a current directory deleted under the shell, a script under a
directory the user may not search and a low process limit (both as a real second user, uid 65534), a low open-file
limit. Each is one `ddpboot: error:` line that says what to do, exit 2, nothing started; or, where the job fits, a
job that runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, as_uid, clean_env, ddpboot_exe

NOBODY = 65534
MARK = "import os, pathlib, sys\npathlib.Path(sys.argv[1], 'rank' + os.environ['RANK']).write_text('')\n"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user may enter (pytest's own are root's 0700), removed after the test."""
    top = Path(tempfile.mkdtemp(prefix="ddpboot-env-", dir="/tmp"))
    top.chmod(0o755)
    for shared in ("marks", "locks"):
        (top / shared).mkdir()
        (top / shared).chmod(0o1777)
    (top / "mark.py").write_text(MARK)
    yield top
    for d in top.rglob("*"):
        if d.is_dir():
            d.chmod(0o755)
    shutil.rmtree(top)


def nobody_launcher() -> list[str]:
    """How uid 65534 starts ddpboot: this interpreter if that user may run it, else the system's python3 of the same
    version with this checkout and its packages on PYTHONPATH; skip without either."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the launcher runs as uid 65534")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(candidate) and as_uid(NOBODY, lambda c=candidate: [str(subprocess.run(  # type: ignore[misc]
                [c, "-c", "import typer, psutil"], env={"PYTHONPATH": pythonpath()}, capture_output=True,
                timeout=60).returncode)]) == ["0"]:
            return [candidate, "-m", "ddpboot"]
    pytest.skip(f"no {version} that uid {NOBODY} may run")


def pythonpath() -> str:
    return f"{REPO}:{sysconfig.get_paths()['purelib']}"


def as_nobody(args: list[str], cwd: Path, nproc_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    limit = f"ulimit -u {nproc_limit}; " if nproc_limit is not None else ""
    env = clean_env(PYTHONPATH=pythonpath(), HOME=str(cwd), DDPBOOT_LOCK_DIR=str(cwd / "locks"))
    env.pop("XDG_RUNTIME_DIR", None)
    line = limit + "exec " + " ".join(f"'{a}'" for a in [*nobody_launcher(), *args])
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "bash", "-c", line],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def one_error(done: subprocess.CompletedProcess[str], marks: Path) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpboot: error: "), done.stderr
    assert not list(marks.iterdir()), "a rank started"
    return lines[0]


def test_a_deleted_current_directory_is_one_error_even_with_an_absolute_script(shared_dir: Path) -> None:
    gone = shared_dir / "gone"
    gone.mkdir()
    line = ("cd gone && rmdir ../gone && for s in mark.py " + str(shared_dir / "mark.py") + "; do "
            + " ".join(ddpboot_exe()) + f" --cpu --nproc 2 $s {shared_dir / 'marks'}; echo rc=$?; done")
    done = subprocess.run(["bash", "-c", line], cwd=shared_dir, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["rc=2", "rc=2"] and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"ddpboot: error: the current directory {gone} no longer exists")
                                   and f"`cd {shared_dir}`" in line for line in lines), done.stderr
    assert not list((shared_dir / "marks").iterdir())


def test_a_script_under_a_directory_the_user_may_not_search(shared_dir: Path) -> None:
    closed = shared_dir / "closed"
    closed.mkdir()
    (closed / "train.py").write_text(MARK)
    closed.chmod(0o700)
    marks = shared_dir / "marks"
    for script in (str(closed / "train.py"), "closed/train.py"):
        line = one_error(as_nobody(["--cpu", "--nproc", "2", script, str(marks)], shared_dir), marks)
        assert line.startswith(f"ddpboot: error: the script '{script}' cannot be reached: you may not search the "
                               f"directory {closed} (its mode is drwx------, owner root)"), line
        assert "chmod o+x" in line
    done = as_nobody(["--cpu", "--nproc", "2", "mark.py", str(marks)], shared_dir)  # the same user, a script it sees
    assert done.returncode == 0 and sorted(p.name for p in marks.iterdir()) == ["rank0", "rank1"], done.stderr


def test_a_low_process_limit_counts_the_launchers_own_processes(shared_dir: Path) -> None:
    """4 ranks need 4 + 1 processes (the guardian) beside the launcher and what uid 65534 runs already (R, measured
    first): a limit of R + 5 is refused before anything starts (it crashed at fork before); R + 6 would run, R + 8
    does (room for another process of that user meanwhile); with --fast-start one more is counted."""
    marks = shared_dir / "marks"
    others = int(as_uid(NOBODY, lambda: [str(sum(1 for p in Path("/proc").iterdir() if p.name.isdigit()
                                                  and p.stat().st_uid == NOBODY) - 1)])[0])
    line = one_error(as_nobody(["--cpu", "--nproc", "4", "mark.py", str(marks)], shared_dir, others + 5), marks)
    assert line.startswith("ddpboot: error: --nproc 4: the job needs 5 processes (4 ranks and 1 of the launcher's")
    assert f"(ulimit -u, RLIMIT_NPROC) is {others + 5}. Ask for at most 3 ranks" in line, line
    forked = one_error(as_nobody(["--fast-start", "--cpu", "--nproc", "4", "mark.py", str(marks)], shared_dir,
                                 others + 6), marks)
    assert "needs 6 processes (4 ranks and 2 of the launcher's: its guardian and the process that forks" in forked
    done = as_nobody(["--cpu", "--nproc", "4", "mark.py", str(marks)], shared_dir, others + 8)
    assert done.returncode == 0 and len(list(marks.iterdir())) == 4, done.stderr


def test_as_root_a_low_process_limit_is_not_refused(shared_dir: Path) -> None:
    """The kernel does not apply RLIMIT_NPROC to root: `ulimit -u 5` with 6 ranks runs."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    marks = shared_dir / "marks"
    line = "ulimit -u 5; exec " + " ".join(ddpboot_exe()) + f" --cpu --nproc 6 mark.py {marks}"
    done = subprocess.run(["bash", "-c", line], cwd=shared_dir, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and len(list(marks.iterdir())) == 6, done.stderr


def test_an_open_file_limit_of_64_runs_8_ranks_and_explains_the_ninth(shared_dir: Path) -> None:
    """8 ranks need 8 × 5 files in the launcher and 24 of its own: 64. A 9th is refused with the count explained."""
    marks = shared_dir / "marks"

    def run(n: int) -> subprocess.CompletedProcess[str]:
        line = "ulimit -n 64; exec " + " ".join(ddpboot_exe()) + f" --cpu --nproc {n} mark.py {marks}"
        return subprocess.run(["bash", "-c", line], cwd=shared_dir, env=clean_env(), capture_output=True, text=True,
                              timeout=120)

    line = one_error(run(9), marks)
    assert "--nproc 9: the launcher needs up to 5 open files per rank (its output pipes, its log file, py-spy's " \
        "pipes during a stack dump) and 24 of its own" in line and "69 in all" in line, line
    assert "Ask for at most 8 ranks" in line
    done = run(8)
    assert done.returncode == 0 and len(list(marks.iterdir())) == 8, done.stderr
