"""The launcher never harms what started it: every way a worker fails to start, and every path on which the launcher's
processes signal a process group, runs under a real parent shell (`bash -c 'ddpboot ...; echo after=$?'`, in a
session of its own so that a launcher signalling the wrong group kills only that shell), which must live on to print
the launcher's exit code; nothing may be left in the job's TMPDIR.

A rank that cannot exec is one `ddpboot: error:` line naming the rank, the program and the errno: exit 2 when it
happens before any rank ran, the shell's 127 (not found) or 126 (cannot run) when a restart cannot start it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import BEHAVE, TIMEOUT, ddpboot_exe, launch_env, wait_for


def in_shell(args: list[str], env: dict[str, str], cwd: Path | None = None,
             timeout: float = TIMEOUT) -> tuple[int | None, str, str]:
    """Run ddpboot from a bash that then prints its exit code; (that code or None if the shell died, the output)."""
    line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), *args])
    proc = subprocess.run(["bash", "-c", f"{line}; echo after=$?"], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, start_new_session=True)
    found = re.search(r"^after=(\d+)$", proc.stdout, re.M)
    assert proc.returncode == 0 and found, (
        f"the calling shell died (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return int(found[1]), proc.stdout, proc.stderr


def loop_of_interpreters(tmp: Path, depth: int = 5) -> Path:
    """A program whose #! interpreters are scripts naming each other `depth` deep: each exists and may run, so
    nothing before exec can tell, and the kernel refuses it (ELOOP past 4 levels)."""
    prev = "/bin/sh"
    for i in range(depth + 1):
        path = tmp / f"interp{i}"
        path.write_text(f"#!{prev}\necho never\n")
        path.chmod(0o755)
        prev = str(path)
    return Path(prev)


def error_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("ddpboot: error:")]


def test_exec_failure_at_the_start_leaves_the_caller_and_nothing_else(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    program = loop_of_interpreters(tmp_path)
    code, _, err = in_shell(["--nproc", "2", "--no-python", str(program)], launch_env(tmp_path, tmp))
    assert code == 2, err
    [line] = error_lines(err)
    assert "rank 0 cannot start" in line and str(program) in line and "ELOOP" in line, err
    assert list(tmp.iterdir()) == []


def test_missing_interpreter_is_refused_before_anything_starts(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = launch_env(tmp_path, tmp, PYTHON_EXEC="/nonexistent/python")
    code, _, err = in_shell(["--nproc", "2", BEHAVE], env)
    assert code == 2, err
    assert "PYTHON_EXEC=/nonexistent/python: /nonexistent/python does not exist" in err
    assert list(tmp.iterdir()) == []


def test_missing_shebang_interpreter_is_refused_before_anything_starts(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "bad.sh"
    script.write_text("#!/nonexistent/bin/bash\necho hi\n")
    script.chmod(0o755)
    code, _, err = in_shell(["--nproc", "2", "--no-python", str(script)], launch_env(tmp_path, tmp))
    assert code == 2, err
    assert "names /nonexistent/bin/bash, which does not exist" in err
    assert list(tmp.iterdir()) == []


def test_a_restart_that_cannot_exec_exits_127(tmp_path: Path) -> None:
    """The first attempt runs and fails, and takes its program with it: the restart's exec finds nothing."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    program = tmp_path / "once.sh"
    program.write_text('#!/bin/sh\nrm -f "$0"\nexit 3\n')
    program.chmod(0o755)
    code, _, err = in_shell(["--nproc", "1", "--max-restarts", "1", "--no-python", str(program)],
                            launch_env(tmp_path, tmp))
    assert code == 127, err
    [line] = error_lines(err)
    assert "rank 0 cannot start" in line and "ENOENT" in line and "exit code 127" in line, err
    assert list(tmp.iterdir()) == []


def test_kill_9_of_the_launcher_leaves_the_caller(tmp_path: Path) -> None:
    """The guardian's path: the launcher dies, the guardian kills every worker group, and only those."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = launch_env(tmp_path, tmp)
    line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), "--nproc", "2", BEHAVE, "--hold", "*"])
    ready = " ".join(shlex.quote(str(tmp_path / f"ready{r}")) for r in (0, 1))
    script = (f"{line} & pid=$!; for f in {ready}; do while [ ! -e $f ] && kill -0 $pid; do sleep 0.05; done; done; "
              "kill -9 $pid; wait $pid; echo after=$?")
    proc = subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "after=137" in out, (proc.returncode, out, err)
    ranks = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("LAUNCH_TEST_OUT")
             == str(tmp_path)]
    wait_for(lambda: all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in ranks), 10,
             "the ranks to die with their launcher")
    wait_for(lambda: list(tmp.iterdir()) == [], 10, "the guardian to remove the run directory")


def test_smoke_timeout_leaves_the_caller(tmp_path: Path) -> None:
    """smoke stops its launcher at --timeout (SIGTERM, then SIGKILL of the launcher's own session)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code, out, err = in_shell(["smoke", "--cpu", "--nproc", "2", "--timeout", "0.5", "--checks", "all_reduce"],
                              launch_env(tmp_path, tmp))
    assert code == 1, (out, err)


def test_stacks_ignores_a_damaged_record(tmp_path: Path) -> None:
    """A launcher record naming pid 0 (a damaged file) is no job: `ddpboot stacks` must not send its signal to
    "process 0", which is the caller's own group."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launcher.json").write_text(json.dumps({"pid": 0, "run_id": "x", "run_dir": str(run_dir)}))
    code, _, err = in_shell(["stacks", str(run_dir), "--timeout", "1"], launch_env(tmp_path))
    assert code == 2, err
    assert "not running" in err


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare(1) for a pid namespace whose next pid it sets")
def test_stacks_and_top_leave_alone_a_process_that_took_a_dead_launchers_pid(tmp_path: Path) -> None:
    """After `kill -9` of a launcher its run directory still holds launcher.json and status.json; a new process
    then gets the dead launcher's pid (for real: in a pid namespace of its own, whose next pid is set). `ddpboot top`
    and `ddpboot stacks` must say that job is no longer running (exit 2), remove the stale files, and never signal
    the process that has the pid now."""
    helper = Path(__file__).with_name("scripts") / "stale_record.py"
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(helper),
                           ddpboot_exe()[0], BEHAVE, str(tmp_path)], env=launch_env(tmp_path), capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["bystander"] == r["launcher"], r  # the record's pid names another process now
    assert {"launcher.json", "status.json"} <= set(r["left"]), r
    assert r["alive"] and r["signals"] == [], r
    for command in ("top", "stacks"):
        code, err = r[command]
        assert code == 2, (command, err)
        assert "that job is no longer running" in err and f"pid {r['launcher']} is now another process" in err, err
        assert "launcher.json and status.json removed" in err, err
        assert err.count("\n") == 1 and err.startswith("ddpboot: error: "), err
    assert "launcher.json" not in r["after_top"] and "status.json" not in r["after_stacks"], r


def test_the_guard_refuses_the_callers_group() -> None:
    """Whatever a bug computes, the one function that signals groups refuses 0, 1 and the caller's own group."""
    from ddpboot.launch.procs.groups import NotOurGroup, signal_group, signal_process

    for pgid in (0, 1, -5, os.getpgrp()):
        try:
            signal_group(pgid, 0)
        except NotOurGroup:
            continue
        raise AssertionError(f"signal_group({pgid}) was carried out")
    for pid in (0, 1, -1):
        try:
            signal_process(pid, 0)
        except NotOurGroup:
            continue
        raise AssertionError(f"signal_process({pid}) was carried out")
    assert sys.platform.startswith("linux")
