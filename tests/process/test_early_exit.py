"""A rank that leaves early (exit 0 before a collective its peers wait in) is named in the failure summary: the
failure of the rank in the collective is its consequence."""

from __future__ import annotations

from pathlib import Path

from tests.support import SCRIPTS, launch_env, run_launcher


def test_the_summary_names_the_rank_that_left_early(tmp_path: Path) -> None:
    proc = run_launcher(["--cpu", "--nproc", "2", str(SCRIPTS / "early_exit.py")], launch_env(tmp_path))
    assert proc.returncode == 1, proc.stderr
    assert "ddpboot: rank 0 failed: exit code 1" in proc.stderr
    [note] = [ln for ln in proc.stderr.splitlines() if ln.startswith("  note: rank 1 exited 0")]
    assert "s before rank 0 failed, while the job failed" in note and "look at why rank 1 ended first" in note
