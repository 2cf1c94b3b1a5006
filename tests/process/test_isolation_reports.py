"""Rank isolation's one trap is reported, never silent: a script that counts GPUs sees only its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import SCRIPTS, clean_env, run_launcher

COUNT_GPUS = str(SCRIPTS / "count_gpus.py")


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--nproc", "2"], True),
        (["--nproc", "2", "--isolation", "node"], False),
        (["--nproc", "2", "--cpu"], False),
        (["--nproc", "1"], False),
    ],
)
def test_a_script_that_counts_gpus_hears_what_rank_isolation_shows_it(
    tmp_path: Path, args: list[str], told: bool
) -> None:
    res = run_launcher([*args, COUNT_GPUS], clean_env(DDPBOOT_FAKE_GPUS="2", TMPDIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr
    note = [line for line in res.stderr.splitlines() if "counts GPUs" in line]
    if told:
        assert len(note) == 1, res.stderr
        assert "count_gpus.py:13" in note[0] and "is 1 in every rank, not 2" in note[0]
        assert "--isolation node" in note[0]
    else:
        assert note == [], res.stderr
