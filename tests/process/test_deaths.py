"""Why a rank died, told from what the machine recorded: a 2-rank gloo job in a real memory cgroup (v1 or v2,
whichever this machine has; created as root) whose rank 1 outgrows its limit and is killed by the kernel's OOM
killer, a rank ended by a real CPU-time limit (SIGXCPU), and a SIGKILL from outside the job."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.launch.observe.memcg import memory_cgroup
from ddpboot.launch.rundir import RunPaths
from ddpboot.units import format_size
from tests.support import SCRIPTS, TIMEOUT, ddpboot_exe, finish, launch_env, wait_for

GROW = str(SCRIPTS / "grow_memory.py")
LIMIT = int(1.4 * (1 << 30))


def _new_cgroup() -> tuple[Path, int]:
    """A child of this process's memory cgroup (v1), or of the v2 root where it delegates memory; skip naming why
    neither can be made."""
    own = memory_cgroup(os.getpid())
    if own is not None and own.version == 1:
        parent = own.directory
    elif own is None and Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        parent = Path("/sys/fs/cgroup/memory")
    elif "memory" in _read(Path("/sys/fs/cgroup/cgroup.subtree_control")).split():
        parent = Path("/sys/fs/cgroup")
    else:
        pytest.skip("no writable memory cgroup: neither a v1 memory hierarchy nor a v2 root delegating memory")
    child = parent / f"ddpboot-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup ({child}: {exc.strerror}): the test needs root")
    version = 2 if (child / "memory.max").exists() else 1
    (child / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(LIMIT))
    if version == 2:
        with contextlib.suppress(OSError):
            (child / "memory.swap.max").write_text("0")
    return child, version


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, int]]:
    child, version = _new_cgroup()
    yield child, version
    wait_for(lambda: not _read(child / "cgroup.procs").split(), 30, "the test cgroup to empty")
    wait_for(lambda: _rmdir(child), 30, "the test cgroup to go")


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:
        return False
    return True


def _join(cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def test_a_rank_killed_by_the_oom_killer_is_named_with_its_cgroup_s_limit(cgroup: tuple[Path, int],
                                                                           tmp_path: Path) -> None:
    directory, version = cgroup
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [*ddpboot_exe(), "--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "oom", GROW],
        env=launch_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: _join(directory))
    code, _, err = finish(proc, TIMEOUT)
    assert code == 137, err
    why = next(ln for ln in err.splitlines() if ln.startswith("  why: "))
    assert "rank 1 failed: killed by SIGKILL (exit code 137)" in err
    assert "rank 1 was killed by the kernel's OOM killer" in why, err
    assert f"(limit {format_size(LIMIT)}, peak " in why and directory.name in why, why
    assert "rank 1 held " in why and "mmap=True" in why, why
    recorded = json.loads(RunPaths(logs / "oom").attempt(0).error_file(1).read_text())
    assert recorded["message"]["message"] == "ddpboot: " + why.removeprefix("  why: ")
    assert "traceback (recorded by @record" not in err  # ddpboot's own record is not shown as the rank's
    files = "memory.limit_in_bytes" if version == 1 else "memory.max"
    assert files in why, why


def test_a_rank_at_its_cpu_time_limit_is_named_with_the_limit(tmp_path: Path) -> None:
    soft = 12  # seconds of CPU: the rank's imports and start stay below it, its spin reaches it

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 30))

    proc = subprocess.Popen([*ddpboot_exe(), "--nproc-per-node", "2", GROW],
                            env=launch_env(tmp_path, DEATH_TEST_BURN="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=limit)
    code, _, err = finish(proc, TIMEOUT)
    assert code == 128 + signal.SIGXCPU, err
    assert f"  why: rank 1 reached its CPU-time limit (ulimit -t {soft} s, hard {soft + 30} s)" in err, err


def test_a_sigkill_from_outside_the_job_is_said_to_be_unexplained(tmp_path: Path) -> None:
    proc = subprocess.Popen([*ddpboot_exe(), "--nproc-per-node", "2", GROW],
                            env=launch_env(tmp_path, DEATH_TEST_BURN="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    rank1 = wait_for(lambda: _rank_pid(proc.pid, "1"), TIMEOUT, "rank 1 to start")
    wait_for(lambda: _spinning(rank1), TIMEOUT, "rank 1 to spin")
    os.kill(rank1, signal.SIGKILL)
    code, _, err = finish(proc, TIMEOUT)
    assert code == 137, err
    why = next(ln for ln in err.splitlines() if ln.startswith("  why: "))
    assert "rank 1 was killed by SIGKILL from outside the job" in why and "ddpboot did not send it" in why, why
    assert "cannot tell who sent it" in why, why


def _rank_pid(launcher: int, rank: str) -> int | None:
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(launcher).children():
            with contextlib.suppress(psutil.Error):
                if child.environ().get("RANK") == rank:
                    return child.pid
    return None


def _spinning(pid: int) -> bool:
    """The rank has printed that it grows (it is past its start) and burns CPU."""
    import psutil

    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        before = p.cpu_times().user
        time.sleep(0.2)
        return p.cpu_times().user - before > 0.1
    return False


@pytest.mark.parametrize("faulthandler", [True, False])
def test_a_segfault_keeps_its_faulthandler_traceback(faulthandler: bool, tmp_path: Path) -> None:
    crash = "import ctypes; ctypes.string_at(0)"
    flags = ["-X", "faulthandler"] if faulthandler else []
    proc = subprocess.run([*ddpboot_exe(), "--nproc-per-node", "1", "--no-python", sys.executable, *flags, "-c", crash],
                          env=launch_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    assert ("| Fatal Python error: Segmentation fault" in proc.stderr) is faulthandler, proc.stderr
    why = next(ln for ln in proc.stderr.splitlines() if ln.startswith("  why: "))
    assert why.startswith("  why: rank 0 crashed with SIGSEGV, a segmentation fault"), why
    assert ("its faulthandler traceback is in its output above" in why) is faulthandler, why
    assert ("PYTHONFAULTHANDLER=1" in why) is not faulthandler, why
