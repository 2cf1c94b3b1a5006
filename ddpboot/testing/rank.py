"""Inside a rank: `python -m ddpboot.testing.rank RESULTS` runs the test the job file describes and records the
outcome (job.py). Started by the launcher, exec'd or forked in the session server (server.py).

Before anything else the rank arms faulthandler with the test's timeout: when it strikes, every thread's stack goes
to `rank<N>.stacks`; a moment later the pytest process stops the launcher, which ends every rank (no orphans), and
the report shows where each rank was.
"""

from __future__ import annotations

import contextlib
import faulthandler
import inspect
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpboot.testing.fixtures import CONTEXT_ARG, RankFixtureRef, registered
from ddpboot.testing.job import Job, RankResult, read_job, write_result
from ddpboot.testing.loader import extend_path, load_test_module


def resolve(value: Any, ctx: Any, stack: contextlib.ExitStack) -> Any:
    """A test argument's value in this rank: a rank fixture is called here (its teardown joins `stack`)."""
    if not isinstance(value, RankFixtureRef):
        return value
    fn = registered(value.path, value.name)
    if fn is None:  # defined in a file the rank has not imported yet (a conftest)
        load_test_module(value.path, value.module)
        fn = registered(value.path, value.name)
    if fn is None:
        raise LookupError(f"rank fixture {value.name!r} is not in {value.path} in this rank")
    kwargs = {name: resolve(v, ctx, stack) for name, v in value.values.items()}
    if CONTEXT_ARG in inspect.signature(fn).parameters:
        kwargs[CONTEXT_ARG] = ctx
    if inspect.isgeneratorfunction(fn):
        return stack.enter_context(contextlib.contextmanager(fn)(**kwargs))
    return fn(**kwargs)


def run_test(job: Job, ctx: Any) -> None:
    extend_path(job.sys_path)
    module = load_test_module(job.path, job.module)
    owner, _, name = job.function.rpartition(".")
    # A test method runs on a fresh instance of its class, as pytest does it.
    fn: Callable[..., Any] = getattr(getattr(module, owner)() if owner else module, name)
    fn = getattr(fn, "__wrapped__", fn)
    kwargs = pickle.loads(job.kwargs)
    with contextlib.ExitStack() as stack:
        args = {name: resolve(v, ctx, stack) for name, v in kwargs.items()}
        if CONTEXT_ARG in inspect.signature(fn).parameters:
            args[CONTEXT_ARG] = ctx
        fn(**args)


def _format(exc: BaseException) -> str:
    """The traceback from the test's own frames on (this module's are left out, as pytest leaves out its own)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def main(results: Path) -> int:
    rank = int(os.environ.get("RANK", "0"))
    job = read_job(results)
    stacks = (results / f"rank{rank}.stacks").open("w")
    # At the deadline every thread's stack goes to the file; the launcher is stopped just after (see above).
    faulthandler.dump_traceback_later(max(job.deadline - time.time(), 0.001), file=stacks)
    result = RankResult(rank, False)
    try:
        import ddpboot

        run_test(job, ddpboot.init())
        result = RankResult(rank, True)
    except BaseException as exc:  # every failure, assertion or crash, is this rank's result
        result = RankResult(rank, False, _format(exc))
    finally:
        faulthandler.cancel_dump_traceback_later()
    stacks.close()
    if not (results / f"rank{rank}.stacks").stat().st_size:
        (results / f"rank{rank}.stacks").unlink()
    write_result(results, result)
    if result.passed:
        _settle()
    return 0 if result.passed else 1


def _settle() -> None:
    """Wait for the other ranks before leaving: a rank that leaves while a slower peer is still inside
    init_process_group breaks that peer's gloo connection ("Connection closed by peer"). A peer that fails
    instead ends the job (fail-fast); this rank's result is written already."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
