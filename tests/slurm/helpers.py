"""Helpers for the tests that run against ddpboot's local SLURM cluster (scripts/ci/slurm-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

START_HINT = "start the test cluster with `sudo scripts/ci/slurm-up`"
# The test cluster's own config (scripts/ci/slurm-up writes it; same directory variable and default). Every SLURM
# command of the tests gets it as SLURM_CONF, so they never reach a real cluster through /etc/slurm/slurm.conf or a
# user's SLURM_CONF; the jobs they submit inherit it, and so do the jobs' own srun steps.
CLUSTER_DIR = Path(os.environ.get("DDPBOOT_SLURM_DIR") or "/tmp/ddpboot-slurm")
CLUSTER_CONF = CLUSTER_DIR / "slurm.conf"
NODES = [f"n{i}" for i in range(1, 9)]
"""The test cluster's emulated nodes (scripts/ci/slurm-up): tests that use fewer ask for them with -N."""
# Each task prints its SLURM environment variables as JSON.
DUMP_ENV = [
    sys.executable,
    "-c",
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if 'SLURM' in k}))",
]


def slurm_env() -> dict[str, str]:
    """This process's environment without SLURM_* variables (pytest may itself run inside a job), with SLURM_CONF
    naming the test cluster's config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(CLUSTER_CONF)
    return env


def slurm(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=slurm_env(), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def task_envs(tmp_path: Path, *srun_args: str) -> list[dict[str, str]]:
    """Run DUMP_ENV under `srun` (one output file per task: srun splits and interleaves long lines on its own
    stdout) and return the tasks' SLURM environments, ordered by SLURM_PROCID."""
    out = slurm("srun", *srun_args, "-t", "1", f"--output={tmp_path}/env.%t", *DUMP_ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    envs = [json.loads(path.read_text()) for path in tmp_path.glob("env.*")]
    return sorted(envs, key=lambda e: int(e["SLURM_PROCID"]))
