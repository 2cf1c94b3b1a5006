"""Every test in this folder runs against ddpboot's local SLURM cluster and skips when none is up."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.slurm.helpers import CLUSTER_CONF, NODES, START_HINT, slurm


@pytest.fixture(scope="session", autouse=True)
def cluster() -> None:
    """Skip the module unless ddpboot's test cluster answers."""
    if shutil.which("sinfo") is None or shutil.which("srun") is None:
        pytest.skip(f"SLURM client tools (sinfo, srun) are not installed: {START_HINT} (it installs them)")
    if not CLUSTER_CONF.is_file():
        pytest.skip(f"no test cluster config at {CLUSTER_CONF} (DDPBOOT_SLURM_DIR): {START_HINT}")
    try:
        ping = slurm("scontrol", "ping", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"`scontrol ping` did not answer within 20 s: {START_HINT}")
    if ping.returncode != 0 or "UP" not in ping.stdout:
        why = [line for line in (ping.stdout + ping.stderr).splitlines() if line.strip() and line[0] != "*"]
        pytest.skip(f"no SLURM controller answers `scontrol ping` ({why[-1] if why else 'no output'}): {START_HINT}")
    nodes = slurm("sinfo", "-h", "-N", "-o", "%N", timeout=20)
    if sorted(set(nodes.stdout.split())) != NODES:
        pytest.skip(f"the SLURM cluster here is not ddpboot's test cluster (nodes {' '.join(NODES)}): "
                    f"{nodes.stdout.split()}; {START_HINT} (it restarts an older one)")


@pytest.fixture
def jobs() -> Iterator[list[str]]:
    """Job ids a test submits; cancelled afterwards whatever happened."""
    ids: list[str] = []
    yield ids
    if ids:
        slurm("scancel", *ids, timeout=30)
