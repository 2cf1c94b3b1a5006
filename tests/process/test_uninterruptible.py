"""A rank stuck in the kernel while the job runs: rank 1 of a real job frozen by a real cgroup freezer (its state
then reads D, in the kernel call it was frozen in), with TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=2: the launcher
warns once, naming the rank, its wait channel and how long, and a stack dump's verdict names it; thawed, the job
ends as it would have."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support import ddpboot_exe, finish, launch_env, stderr_until, wait_for

RANK = """
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
(out / f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
while not (out / "release").exists():
    time.sleep(0.05)
"""


def _freezer() -> Path:
    v1 = Path("/sys/fs/cgroup/freezer")
    if (v1 / "cgroup.procs").exists():
        made = v1 / f"ddpboot-test-{uuid.uuid4().hex[:8]}"
        try:
            made.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot create a freezer cgroup ({made}: {exc.strerror}): the test needs root")
        return made
    pytest.skip("no v1 freezer hierarchy on this machine")


def test_a_frozen_rank_is_said_to_be_stuck_in_the_kernel(tmp_path: Path) -> None:
    freezer = _freezer()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.Popen([*ddpboot_exe(), "--nproc-per-node", "2", str(script), str(tmp_path)],
                            env=launch_env(tmp_path, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid = int(wait_for(lambda: (tmp_path / "pid1").exists() and (tmp_path / "pid1").read_text(), 60,
                           "rank 1's pid"))
        (freezer / "cgroup.procs").write_text(str(pid))
        (freezer / "freezer.state").write_text("FROZEN")
        lines = stderr_until(proc, lambda ls: any("stuck in the kernel" in ln for ln in ls), 60)
        warned = [ln for ln in lines if "stuck in the kernel" in ln]
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()  # where the kernel holds it (frozen in place)
        seconds = warned[0].split(" for ")[1].split(" s,")[0] if warned else "?"
        assert warned == [f"ddpboot: warning: rank 1 (pid {pid}) is stuck in the kernel: in uninterruptible sleep "
                          f"(D state) for {seconds} s, in {wchan} (TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=2); no "
                          "signal ends it until the call returns"], lines
        assert float(seconds) >= 2
        os.kill(proc.pid, signal.SIGUSR2)  # a stack dump on demand: its verdict names the frozen rank
        verdict = f"ddpboot: verdict: rank 1 (pid {pid}) is stuck in the kernel"
        lines = stderr_until(proc, lambda ls: any(ln.startswith(verdict) for ln in ls), 120)
        assert any(ln.startswith(verdict) and ln.endswith(f", in {wchan}") for ln in lines), lines
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        (tmp_path / "release").touch()
    code, _, err = finish(proc)
    assert code == 0, err
    assert "stuck in the kernel" not in err  # said once
    wait_for(lambda: not (freezer / "cgroup.procs").read_text().split(), 30, "the freezer cgroup to empty")
    os.rmdir(freezer)
