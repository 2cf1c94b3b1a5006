"""The GPU health ledger on a simulated 3-GPU machine: a job on GPU 1 whose GPU reports Xid 79 marks it failing, so
the next `ddpboot plan --nproc 2` takes GPUs 0 and 2 and `ddpboot gpus` says why GPU 1 is out; `--gpus 1` still runs
on it, with one warning; `ddpboot gpus --clear 1` clears it; an application's Xid 13 marks nothing; a GPU that does
not exist is one message and exit 2."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.support import clean_env, run_ddpboot

WAIT = "import time\ntime.sleep(1.5)\n"  # long enough for several looks of the GPU watch (every 0.1 s)


def machine(tmp_path: Path, xid: int) -> dict[str, str]:
    (tmp_path / "gpus.json").write_text(json.dumps([{"index": 0}, {"index": 1, "xids": [xid]}, {"index": 2}]))
    (tmp_path / "wait.py").write_text(WAIT)
    return clean_env(DDPBOOT_FAKE_GPUS=str(tmp_path / "gpus.json"), DDPBOOT_LOCK_DIR=str(tmp_path / "locks"))


def planned_gpus(env: dict[str, str]) -> list[str]:
    plan = run_ddpboot("plan", "--nproc", "2", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    return [g["index"] for r in json.loads(plan.stdout)["ranks"] for g in r["gpus"]]


def test_a_gpu_that_fell_off_the_bus_is_left_out_of_the_next_jobs_choice(tmp_path: Path) -> None:
    env = machine(tmp_path, 79)
    assert planned_gpus(env) == [0, 1]
    job = run_ddpboot("--gpus", "1", "--gpu-watch-interval", "0.1", str(tmp_path / "wait.py"), env=env)
    assert job.returncode == 0, job.stderr
    assert "GPU 1 (rank 0) reported Xid 79" in job.stderr and "GPU 1 is marked failing" in job.stderr, job.stderr
    [mark] = (tmp_path / "locks").glob("gpu-*.failing")
    assert stat.S_IMODE(mark.stat().st_mode) == 0o644  # everyone reads it, only its writer replaces it
    assert planned_gpus(env) == [0, 2]
    gpus = run_ddpboot("gpus", env=env)
    [line] = [ln for ln in gpus.stdout.splitlines() if ln.startswith(" 1 ")]
    assert "failing (Xid 79)" in line, gpus.stdout
    run_id = json.loads(mark.read_text())["run_id"]
    assert f"failing: GPU 1: Xid 79 (the GPU has fallen off the bus), seen by job {run_id} of " in gpus.stdout, gpus
    as_json = json.loads(run_ddpboot("gpus", "--json", env=env).stdout)["gpus"]
    assert [bool(g["failing"]) for g in as_json] == [False, True, False]
    # named, it still runs there, with one warning
    again = run_ddpboot("--gpus", "1", "--gpu-watch", "off", str(tmp_path / "wait.py"), env=env)
    assert again.returncode == 0, again.stderr
    [warning] = [ln for ln in again.stderr.splitlines() if "warning" in ln]
    assert warning.startswith(f"ddpboot: warning: GPU 1 is marked failing (Xid 79 (the GPU has fallen off the bus), "
                              f"seen by job {run_id} of "), warning
    assert warning.endswith("but was asked for with --gpus: running on it anyway (`ddpboot gpus --clear 1` clears "
                            "the mark)"), warning
    cleared = run_ddpboot("gpus", "--clear", "1", env=env)
    assert cleared.returncode == 0 and cleared.stdout.startswith("GPU 1: failing mark cleared (Xid 79"), cleared
    assert planned_gpus(env) == [0, 1]
    assert run_ddpboot("gpus", "--clear", "1", env=env).stdout == "GPU 1: was not marked failing\n"


def test_an_application_error_marks_nothing(tmp_path: Path) -> None:
    env = machine(tmp_path, 13)
    job = run_ddpboot("--gpus", "1", "--gpu-watch-interval", "0.1", str(tmp_path / "wait.py"), env=env)
    assert job.returncode == 0 and "GPU 1 (rank 0) reported Xid 13" in job.stderr, job.stderr
    assert "marked failing" not in job.stderr
    assert not list((tmp_path / "locks").glob("gpu-*.failing"))
    assert planned_gpus(env) == [0, 1]


@pytest.mark.parametrize("gpu", ["7", "x", ""])
def test_clearing_a_gpu_that_does_not_exist_is_one_message(tmp_path: Path, gpu: str) -> None:
    got = run_ddpboot("gpus", "--clear", gpu, env=machine(tmp_path, 79))
    assert got.returncode == 2 and got.stdout == "", got
    assert len(got.stderr.strip().splitlines()) == 1 and got.stderr.startswith("ddpboot: error: --clear"), got.stderr
