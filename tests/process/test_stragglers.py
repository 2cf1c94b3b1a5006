"""Stragglers named while a real 2-rank gloo job runs: rank 1 computing six times as long as rank 0 before each
all_reduce is named on the console, in status.json and in `ddpboot top --json` while the job runs; even ranks are
never named; across two nodes (two launchers on this machine, one rank each), node 0 names node 1's rank."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.support import (
    SCRIPTS,
    TIMEOUT,
    clean_env,
    finish,
    free_port,
    run_ddpboot,
    start_launcher,
    stderr_until,
    wait_for,
)

JOB = str(SCRIPTS / "straggler_job.py")
NAMED = "ddpboot: straggler: rank 1 (node 0) is slower than the others"


def _naming(logs: Path) -> dict[str, Any] | None:
    """status.json once it names a straggler (None before)."""
    status: dict[str, Any] = json.loads(next(logs.glob("*/status.json")).read_text())
    return status if any(r["straggler"] for r in status["ranks"]) else None


def test_a_rank_that_computes_six_times_longer_is_named_while_the_job_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = start_launcher(["--nproc", "2", "--cpu", "--straggler-window", "3", "--log-dir", str(logs), JOB, "slow"],
                          clean_env())
    lines = stderr_until(proc, lambda got: any(NAMED in line for line in got), TIMEOUT)
    running = proc.poll() is None
    # the status file is rewritten at most every so often: await the one that names the straggler
    status = wait_for(lambda: _naming(logs) if proc.poll() is None else {}, TIMEOUT, "status.json naming rank 1",
                      interval=0.1) if running else {}
    top = run_ddpboot("top", "--json", str(next(logs.glob("*")).name), env=clean_env()) if running else None
    code, out, err = finish(proc)
    said = [line for line in lines + err.splitlines() if line.startswith("ddpboot: straggler:")]
    assert code == 0, (out, lines, err)
    assert running, ("the job ended before rank 1 was named", lines)
    assert said[0].startswith(NAMED) and sum(NAMED in line for line in said) == 1, said  # named once
    assert all(s.startswith(NAMED) or "rank 1 keeps pace again" in s for s in said), err  # at the end, the ranks
    # even out
    m = re.search(r"it computed (\d+)% of the time and the other ranks (\d+)%", said[0])
    assert m and int(m[1]) >= 2 * int(m[2]), said  # its CPU share against the waiting rank's (a crowded machine
    # lowers both)
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert ranks[0]["straggler"] is None and ranks[1]["straggler"], status
    assert top is not None and top.returncode == 0, top
    rows = {r["rank"]: r for r in json.loads(top.stdout)["ranks"]}
    assert rows[0]["straggler"] is None and rows[1]["straggler"] == ranks[1]["straggler"], rows


def test_even_ranks_are_not_named(tmp_path: Path) -> None:
    proc = start_launcher(["--nproc", "2", "--cpu", "--straggler-window", "3", JOB, "even"], clean_env())
    code, out, err = finish(proc)
    assert code == 0 and out.count("40 steps") == 2, (out, err)
    assert "straggler" not in err, err


def test_node_0_names_a_slow_rank_of_another_node_through_the_store(tmp_path: Path) -> None:
    port = free_port()
    procs = [start_launcher(["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
                             str(port), "--nproc", "1", "--cpu", "--straggler-window", "3", JOB, "slow"], clean_env())
             for node in (0, 1)]
    lines = stderr_until(procs[0], lambda got: any(line.startswith("ddpboot: straggler:") for line in got), TIMEOUT)
    running = procs[0].poll() is None
    (code0, _, err0), (code1, _, err1) = finish(procs[0]), finish(procs[1])
    said = [line for line in lines + err0.splitlines() if line.startswith("ddpboot: straggler:")]
    assert (code0, code1) == (0, 0), (lines, err0, err1)
    assert running and said, lines
    assert said[0].startswith("ddpboot: straggler: rank 1 (node 1) is slower than the others"), said
    assert "ddpboot: straggler:" not in err1  # node 0 speaks for the job
