"""One `ddp` test as the ranks receive it (the job file) and as the pytest process reports it (the results).

The pytest process writes `job.pkl` into the test's results directory: where the test function lives, the
pytest process's sys.path, the timeout, and the function's arguments pickled (parameters and fixture values, a
`RankFixtureRef` for each rank fixture; `ddp_ctx` is each rank's own). Each rank writes `rank<N>.json` (passed, its
traceback with pytest's rewritten assertion) and, if the timeout struck, `rank<N>.stacks` (every thread's stack).
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.testing.fixtures import CONTEXT_ARG

JOB_FILE = "job.pkl"
LAUNCHER_LOG = "launcher.log"
PRELOAD_VAR = "DDPBOOT_TESTING_PRELOAD"  # the session server's tests: {"sys_path": [...], "modules": [[name, path]]}


class NotPicklable(Exception):
    """A test argument that cannot reach the ranks; the message names it and says what to do."""


@dataclass(frozen=True)
class Job:
    path: str  # the test's file
    module: str  # its module name in the pytest process
    function: str  # the function's name (without a parametrization id), `Class.name` for a method
    sys_path: tuple[str, ...]
    deadline: float  # time.time() at which every rank dumps its stack (the test's timeout from its start)
    kwargs: bytes  # the pickled arguments


def make_job(path: str, module: str, function: str, funcargs: dict[str, Any], timeout: float) -> Job:
    """The job for a test whose resolved arguments are `funcargs`; raises NotPicklable naming the first argument
    that cannot be pickled."""
    for name, value in funcargs.items():
        if name == CONTEXT_ARG:
            continue
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise NotPicklable(
                f"the value of {name!r} cannot be sent to the ranks: {type(exc).__name__}: {exc}. Give the ranks a "
                f"picklable value, or make {name!r} a fixture that each rank builds for itself with "
                "@ddpboot.testing.rank_fixture"
            ) from None
    kwargs = {k: v for k, v in funcargs.items() if k != CONTEXT_ARG}
    return Job(path, module, function, tuple(sys.path), time.time() + timeout, pickle.dumps(kwargs))


def write_job(job: Job, results: Path) -> None:
    (results / JOB_FILE).write_bytes(pickle.dumps(job))


def read_job(results: Path) -> Job:
    job = pickle.loads((results / JOB_FILE).read_bytes())
    assert isinstance(job, Job)
    return job


@dataclass(frozen=True)
class RankResult:
    rank: int
    passed: bool
    traceback: str = ""
    stacks: str = ""


def write_result(results: Path, result: RankResult) -> None:
    record = {"rank": result.rank, "passed": result.passed, "traceback": result.traceback}
    (results / f"rank{result.rank}.json").write_text(json.dumps(record))


def read_results(results: Path, nproc: int) -> list[RankResult]:
    """Every rank's result; a rank that wrote none (it crashed or was killed) counts as failed, with its stacks
    if the timeout dumped them."""
    out = []
    for rank in range(nproc):
        stacks_file = results / f"rank{rank}.stacks"
        stacks = stacks_file.read_text(errors="replace") if stacks_file.exists() else ""
        try:
            record = json.loads((results / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            out.append(RankResult(rank, False, "", stacks))
            continue
        out.append(RankResult(rank, bool(record["passed"]), str(record["traceback"]), stacks))
    return out


def failure_report(results: list[RankResult], code: int, launcher_output: str, timeout: float | None) -> str | None:
    """The test's failure message (None when every rank passed and the launcher exited 0): the first line names
    the failing ranks, then each one's traceback or stack, prefixed by its rank."""
    failed = [r for r in results if not r.passed]
    if not failed and code == 0 and timeout is None:
        return None
    nproc = len(results)
    which = ", ".join(str(r.rank) for r in failed)
    if timeout is not None:
        head = f"timeout: the {nproc}-rank run did not finish within {timeout:g} s"
        head += f"; rank{'s' if len(failed) > 1 else ''} {which} had not passed" if failed else ""
    elif failed:
        head = f"rank{'s' if len(failed) > 1 else ''} {which} of {nproc} failed (launcher exit code {code})"
    else:
        head = f"every rank passed but the launcher exited with code {code}"
    parts = [head]
    for r in failed:
        if r.traceback:
            parts.append(_prefixed(r.rank, "failed", r.traceback))
        if r.stacks:
            parts.append(_prefixed(r.rank, "stack at the timeout", _test_frames(r.stacks)))
    if all(not (r.traceback or r.stacks) for r in failed) or (not failed and code != 0):
        parts.append(f"launcher output:\n{launcher_output.rstrip()}")
    return "\n".join(parts)


_HARNESS = ("/ddpboot/launch/pymain.py\"", "/ddpboot/launch/faststart/forked.py\"",
            "/ddpboot/launch/faststart/zygote.py\"", "<frozen runpy>", "File \"<string>\"")


def _test_frames(stacks: str) -> str:
    """A faulthandler dump without the frames below the test that every rank has (fast start's, runpy's)."""
    return "\n".join(line for line in stacks.splitlines() if not any(h in line for h in _HARNESS))


def _prefixed(rank: int, what: str, text: str) -> str:
    lines = [f"[rank {rank}] {line}" for line in text.rstrip().splitlines()]
    return f"--- rank {rank} {what} ---\n" + "\n".join(lines)
