"""Hung gloo jobs diagnosed by the launcher: each is dumped on demand (SIGUSR2, then `ddpboot stacks RUN --json`)
and then by `--stall-timeout`, with the right rank and frame named in the summary; py-spy on one
job, the ranks' faulthandler (registered by ddpboot.init(), and by the fast-start process) on the others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddpboot.contract import STACKS_END_LINE
from ddpboot.launch.stacks.collect import BACKEND_VAR, find_py_spy
from ddpboot.launch.stacks.find import RunRecord, request_dump
from tests.support import SCRIPTS, ddpboot_exe, launch_env, run_launcher, wait_for

HANG = str(SCRIPTS / "hang_job.py")
STALL = "10"

CASES = {
    # mode: (backend, extra launcher options, what rank 0 and rank 1 wait in)
    "barrier": ("py-spy", [], ("barrier, called from hang_job.py", "not in torch.distributed: sleep_elsewhere")),
    "destroy": ("faulthandler", ["--fast-start"],
                ("destroy_process_group, called from hang_job.py", "not in torch.distributed: sleep_elsewhere")),
    "deadlock": ("faulthandler", [], ("recv, called from hang_job.py", "recv, called from hang_job.py")),
}


def summaries(dump: dict[str, Any]) -> dict[int, str]:
    return {r["rank"]: r["summary"] or "" for r in dump["ranks"]}


def named(dump: dict[str, Any], expected: tuple[str, str]) -> bool:
    s = summaries(dump)
    return all(s.get(rank, "").startswith(want) for rank, want in enumerate(expected))


@pytest.mark.parametrize("mode", sorted(CASES))
def test_a_hung_job_is_dumped_on_demand_and_at_the_stall_timeout(mode: str, tmp_path: Path) -> None:
    backend, options, expected = CASES[mode]
    if backend == "py-spy" and find_py_spy(os.environ) is None:
        pytest.skip("py-spy is not installed (pip install ddpboot[debug])")
    env = launch_env(tmp_path / "out", tmp_path, **{BACKEND_VAR: backend})
    logs = tmp_path / "logs"
    args = ["--cpu", "--nproc", "2", "--log-dir", str(logs), "--stall-timeout", STALL, "--shutdown-timeout", "2",
            *options, HANG, mode]
    # The launcher's output goes to files: a pipe nobody reads while the test waits would fill with the dumps.
    with (tmp_path / "stderr").open("w") as err_file:
        proc = subprocess.Popen([*ddpboot_exe(), *args], env=env, stdout=subprocess.DEVNULL, stderr=err_file,
                                start_new_session=True)
    try:
        record = wait_for(lambda: next(logs.glob("*/launcher.json"), None), 120, "the launcher's record")
        pid = json.loads(record.read_text())["pid"]
        rank_logs = [record.parent / "attempt_0" / f"rank{r}.log" for r in (0, 1)]
        wait_for(lambda: all(p.exists() and "ready" in p.read_text() for p in rank_logs), 120, "both ranks ready")

        def on_demand() -> dict[str, Any] | None:  # SIGUSR2 as `ddpboot stacks` sends it, without its start-up
            path = request_dump(RunRecord(pid, "", record.parent), 30)
            dump = json.loads(path.read_text()) if path is not None else None
            return dump if dump is not None and named(dump, expected) else None

        dump = wait_for(on_demand, 60, f"an on-demand dump naming {expected}", interval=0.2)
        assert dump["reason"].startswith("SIGUSR2 from pid")
        assert {r["backend"] for r in dump["ranks"]} == {backend}
        got = run_launcher(["stacks", str(record.parent), "--json"], env)  # the command, by run directory
        assert got.returncode == 0, got.stderr
        assert named(json.loads(got.stdout), expected)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert code != 0
    assert f"no progress for {STALL} s" in err
    stalled = json.loads(max(logs.glob("*/stacks-*.json"), key=lambda p: p.stat().st_mtime).read_text())
    assert stalled["reason"] == f"no progress for {STALL} s, --stall-timeout"
    assert named(stalled, expected), summaries(stalled)
    for rank, want in enumerate(expected):
        assert f"ddpboot:   rank {rank} (CPU, pid " in err and want in err
    assert STACKS_END_LINE in err
    text = next(logs.glob("*/stacks-1.txt")).read_text()
    assert text.rstrip().splitlines()[-1].startswith(STACKS_END_LINE)


def test_the_stacks_command_for_no_running_job_is_one_error(tmp_path: Path) -> None:
    env = launch_env(tmp_path / "out", tmp_path)
    got = run_launcher(["stacks", str(tmp_path)], env)
    assert got.returncode == 2 and got.stderr.startswith("ddpboot: error: RUN ")
    assert "is no running ddpboot job's pid, run id or run directory" in got.stderr
