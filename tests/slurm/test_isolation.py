"""The test cluster keeps to its own directory (scripts/ci/slurm-up): its config, munged and munge socket are its own,
every SLURM command of the tests reaches it through SLURM_CONF (never /etc/slurm/slurm.conf nor a user's
SLURM_CONF), and a real installation's /etc/slurm/slurm.conf neither stops slurm-up nor is touched by it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.helpers import CLUSTER_CONF, CLUSTER_DIR, slurm, task_envs
from tests.support import REPO

pytestmark = pytest.mark.slurm
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
SYSTEM_MUNGE_KEY = Path("/etc/munge/munge.key")
# A real cluster's config, as far as slurm-up can tell: another cluster name, controller and nodes.
DECOY = (
    "# a real cluster's config, not ddpboot's test cluster\n"
    "ClusterName=decoy\n"
    "SlurmctldHost=decoy-controller\n"
    "AuthType=auth/munge\n"
    "NodeName=decoy[1-4] CPUs=8 State=UNKNOWN\n"
    "PartitionName=batch Nodes=decoy[1-4] Default=YES State=UP\n"
)


def show_config() -> dict[str, str]:
    """`scontrol show config` as a dict ("Key = value" lines)."""
    out = slurm("scontrol", "show", "config", timeout=20)
    assert out.returncode == 0, out.stderr
    pairs = (line.split(" = ", 1) for line in out.stdout.splitlines() if " = " in line)
    return {key.strip(): value.strip() for key, value in pairs}


def fingerprint(path: Path) -> tuple[str, int, int, int] | None:
    """Content hash, mode, owner and mtime of a file (None when there is none): what "untouched" means here."""
    if not path.exists():
        return None
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode, st.st_uid, st.st_mtime_ns


@pytest.fixture
def system_conf() -> Iterator[Path]:
    """/etc/slurm/slurm.conf as a real installation would have it: the machine's own when there is one (only read),
    else a decoy written for this test and removed afterwards, with /etc/slurm when that was missing too."""
    if os.geteuid() != 0:
        pytest.skip("needs root, like scripts/ci/slurm-up")
    if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
        yield SYSTEM_CONF
        return
    made_dir = not SYSTEM_CONF.parent.exists()
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SYSTEM_CONF.write_text(DECOY)
    try:
        yield SYSTEM_CONF
    finally:
        SYSTEM_CONF.unlink(missing_ok=True)
        if made_dir:
            SYSTEM_CONF.parent.rmdir()


def test_commands_reach_the_cluster_through_its_own_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A user's SLURM_CONF does not leak into the tests' commands, nor into the steps of the jobs they start."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "a-users-slurm.conf"))
    config = show_config()
    assert config["SLURM_CONF"] == str(CLUSTER_CONF)
    assert not config["SLURM_CONF"].startswith("/etc/slurm/")
    assert config["ClusterName"] == "ddpboot"
    assert config["AuthInfo"] == f"socket={CLUSTER_DIR}/munge/munge.socket"
    assert [env["SLURM_CONF"] for env in task_envs(tmp_path, "-N2", "-n2")] == [str(CLUSTER_CONF)] * 2


def test_slurm_up_runs_beside_a_real_installation(system_conf: Path, tmp_path: Path) -> None:
    """With /etc/slurm/slurm.conf a real cluster's and a user's SLURM_CONF pointing at it, slurm-up (idempotent: the
    cluster is up) succeeds and leaves it, and the system's munge key, byte for byte as they were."""
    before = fingerprint(system_conf), fingerprint(SYSTEM_MUNGE_KEY)
    ctld_pid = (CLUSTER_DIR / "slurmctld.pid").read_text()
    env = {**os.environ, "SLURM_CONF": str(system_conf)}
    up = subprocess.run(
        [str(REPO / "scripts" / "ci" / "slurm-up")], env=env, capture_output=True, text=True, timeout=120
    )
    assert up.returncode == 0, up.stdout + up.stderr
    assert "already running" in up.stdout, up.stdout
    assert (CLUSTER_DIR / "slurmctld.pid").read_text() == ctld_pid  # the running cluster was left as it was
    assert len(task_envs(tmp_path, "-N2", "-n2")) == 2  # jobs run while the real config is there
    assert (fingerprint(system_conf), fingerprint(SYSTEM_MUNGE_KEY)) == before
