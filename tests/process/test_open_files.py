"""The open-file limit is checked before the store listens: a real launcher under a lowered RLIMIT_NOFILE raises a
low soft limit to the hard one without a word, and refuses, with the numbers and what to raise, a job whose store
cannot hold its ranks' connections even at the hard limit (exit 2, nothing started)."""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.support import clean_env, ddpboot_exe, free_port

RANK = """
import os, resource, sys
from pathlib import Path
Path(sys.argv[1], "started-rank" + os.environ["RANK"]).write_text(str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
"""


def _limit(soft: int, hard: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _run(args: list[str], soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ddpboot_exe(), *args], env=clean_env(), capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit(soft, hard))


def test_a_store_that_cannot_hold_every_rank_is_refused_before_it_listens(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = free_port()
    # node 0 of 300 nodes serves 300 ranks: 2 connections each, 1 per node and 16 of its own = 916 files > 512
    done = _run(["--cpu", "--nnodes", "300", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                 str(port), str(script), str(tmp_path)], 512, 512)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ddpboot: error: --nproc 1 on 300 nodes: this node's store serves all 300 ranks and "
                               "needs about 916 open files"), lines[0]
    assert "(ulimit -n, RLIMIT_NOFILE) is 512 (hard limit 512)" in lines[0]
    assert "Ask for at most 98 ranks in all" in lines[0]  # (512 - 16 - 300) // 2
    assert "ulimit -Hn 916" in lines[0] and "LimitNOFILE=916" in lines[0] and "/etc/security/limits.conf" in lines[0]
    assert not list(tmp_path.glob("started-rank*")), "a rank started"


def test_a_low_soft_limit_is_raised_to_the_hard_limit_and_the_job_runs(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    # 16 ranks need 16 × 5 + 24 = 104 files in the launcher: more than the soft 100, within the hard 4096
    done = _run(["--cpu", "--nproc", "16", "--oversubscribe", str(script), str(tmp_path)], 100, 4096)
    assert done.returncode == 0, done.stderr
    assert "ddpboot: error" not in done.stderr
    seen = {p.name: p.read_text() for p in tmp_path.glob("started-rank*")}
    assert seen == {f"started-rank{r}": "4096" for r in range(16)}
