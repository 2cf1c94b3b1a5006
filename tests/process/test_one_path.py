"""`ddpboot plan`, `ddpboot --dry-run` and a real run take one path from the options to the plan: the same argv gives
the same plan through all three (`plan --json`, `--dry-run --json`, and the plan.json a run writes into its run
directory, checked against what each worker really got), and what one refuses, all three refuse with the same
message."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import BEHAVE, ddpboot_exe, launch_env, reports, run_launcher

SIMULATED = {"DDPBOOT_FAKE_GPUS": "8"}

SAME_PLAN = [
    pytest.param(["--nproc", "2", "--exclude", "0"], {}, id="exclude"),
    pytest.param(["--gpus", "3,1", "--isolation", "node"], {}, id="node-isolation"),
    pytest.param(["--nproc", "2", "--gpus-per-proc", "2", "--cpu-affinity", "none"], {}, id="gpus-per-proc"),
    pytest.param(["--cpu", "--nproc", "3"], {}, id="cpu"),
    pytest.param(["--nproc", "2"], {"CUDA_VISIBLE_DEVICES": "5,2,7"}, id="inherited-cvd"),
    pytest.param(["--nproc", "1"], {"PET_NPROC_PER_NODE": "2"}, id="flag-over-pet"),
]


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Reports into tmp/out, an 8-GPU simulated machine."""
    (tmp / "out").mkdir(exist_ok=True)
    env = launch_env(tmp / "out", tmp)
    env.update(SIMULATED, **extra)
    return env


def plan_of(args: list[str], env: dict[str, str], tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plan --json, the dry run's plan) for the same selection and node options."""
    planned = run_launcher(["plan", *args, "--json"], env)
    assert planned.returncode == 0, planned.stderr
    dry = run_launcher([*args, "--dry-run", "--json", BEHAVE], env)
    assert dry.returncode == 0, dry.stderr
    return json.loads(planned.stdout), json.loads(dry.stdout)["plan"]


@pytest.mark.parametrize(("args", "extra"), SAME_PLAN)
def test_plan_dry_run_and_run_agree(args: list[str], extra: dict[str, str], tmp_path: Path) -> None:
    env = job_env(tmp_path, **extra)
    planned, dry = plan_of(args, env, tmp_path)
    assert planned == dry
    logs = tmp_path / "logs"
    proc = run_launcher([*args, "--log-dir", str(logs), "--rdzv-id", "one", BEHAVE], env)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads((logs / "one" / "plan.json").read_text())
    assert ran == planned
    got = reports(tmp_path / "out")
    assert {r: got[r]["env"]["CUDA_VISIBLE_DEVICES"] for r in got} == {
        slot["rank"]: slot["cuda_visible_devices"] for slot in planned["ranks"]}


def test_a_node_of_several_is_planned_alike(tmp_path: Path) -> None:
    """Node 1 of 2 (the run itself would wait for node 0: plan and dry run only)."""
    args = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", "29533",
            "--nproc", "2"]
    planned, dry = plan_of(args, job_env(tmp_path), tmp_path)
    assert planned == dry
    assert [s["rank"] for s in planned["ranks"]] == [2, 3] and planned["cluster"]["source"] == "flags"


REFUSED = [
    pytest.param(["--cpu", "--nproc", "50000"], {}, "", "more than 16 per core", id="too-many-cpu-ranks"),
    pytest.param(["--nproc", "9"], {}, "", "need 9 free GPUs", id="more-ranks-than-gpus"),
    pytest.param(["--gpus", "0", "--exclude", "0"], {}, "", "excluded", id="excluded-gpu-asked"),
    pytest.param(["--nproc", "2"], {"PET_NNODES": "2"}, "", "came from PET_NNODES=2", id="pet-nnodes"),
    pytest.param(["--nnodes", "1:2"], {}, "", "--rdzv-backend c10d", id="elastic-without-c10d"),
    pytest.param(["--cpu", "--nproc", "20", "--oversubscribe"], {}, "ulimit -n 80", "open-file limit",
                 id="open-files"),
]


@pytest.mark.parametrize(("args", "extra", "shell", "message"), REFUSED)
def test_what_one_refuses_all_refuse_alike(
    args: list[str], extra: dict[str, str], shell: str, message: str, tmp_path: Path
) -> None:
    env = job_env(tmp_path, **extra)
    errors = []
    for argv in (["plan", *args], [*args, "--dry-run", BEHAVE], [*args, BEHAVE]):
        line = " ".join(shlex.quote(a) for a in [*ddpboot_exe(), *argv])
        proc = subprocess.run(["bash", "-c", f"{shell + '; ' if shell else ''}exec {line}"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (argv, proc.stderr)
        [error] = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddpboot: error:")]
        errors.append(error)
    assert message in errors[0] and errors[0] == errors[1] == errors[2], errors
    assert reports(tmp_path / "out") == {}  # no worker ever started
