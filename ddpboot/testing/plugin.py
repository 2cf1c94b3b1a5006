"""The pytest hooks of `ddpboot.testing` (registered through the `pytest11` entry point; see the package's text).

Collection: a `ddp` marker with a list of sizes becomes one item per size (`test_x[nproc=2]`), the sizes this
machine cannot run skipped with the reason. Call: the test's resolved arguments go into a job file, one launcher
run executes it on N ranks (warm: forked in the session server, server.py; cold, `--ddp-cold` or a marker with `args`:
`python -m ddpboot` per test), and the ranks' results become the test's outcome.
"""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ddpboot.testing.job import LAUNCHER_LOG, NotPicklable, failure_report, make_job, read_results, write_job
from ddpboot.testing.options import MARKER_HELP, DdpOptions, MarkerError, parse_marker, skip_reason, uses_gpus
from ddpboot.testing.session import GRACE, STOP_AFTER, SessionServer, SessionServerError

NPROC_ARG = "ddp_nproc"  # the parameter a size matrix sets (a test may ask for it)
_SERVER = pytest.StashKey["_ServerSlot"]()


class _ServerSlot:
    """The session server (warm ranks), started at the end of collection and again after one had to be killed."""

    def __init__(self, modules: list[tuple[str, str]], log: Path) -> None:
        self.modules = modules
        self.log = log
        self.server: SessionServer | None = None

    def get(self) -> SessionServer:
        if self.server is None or not self.server.alive():
            self.server = SessionServer.start(self.modules, self.log)
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("ddpboot").addoption(
        "--ddp-cold", action="store_true",
        help="start each ddp test with its own launcher process (no warm ranks forked from a session process)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


@pytest.fixture
def ddp_ctx() -> None:
    """The rank's ddpboot Context inside the ranks; in the pytest process it is never used."""
    return None


@pytest.fixture
def ddp_nproc(request: pytest.FixtureRequest) -> int:
    """The world size of this item of a `ddp` test."""
    return _nproc(request.node)


@cache
def _gpu_count() -> int:
    """GPUs of the machine through NVML, without CUDA (the pytest process must stay CUDA-free)."""
    from ddpboot.selection.inventory import load_inventory

    return len(load_inventory().units())


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _options(node: Any) -> DdpOptions | None:
    marker = node.get_closest_marker("ddp")
    if marker is None:
        return None
    try:
        return parse_marker(marker.args, marker.kwargs)
    except MarkerError as exc:
        pytest.fail(f"{node.nodeid}: {exc}", pytrace=False)


def _nproc(node: Any) -> int:
    opts = _options(node)
    params = getattr(getattr(node, "callspec", None), "params", {})
    return int(params.get(NPROC_ARG, opts.sizes[0] if opts else 1))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    opts = _options(metafunc.definition)
    if opts is None or not opts.matrix:
        return
    if NPROC_ARG not in metafunc.fixturenames:
        metafunc.fixturenames.append(NPROC_ARG)
    gpus = _gpu_count() if opts.device != "cpu" else 0
    params = []
    for n in opts.sizes:
        reason = skip_reason(opts.device, n, gpus, _cores())
        params.append(pytest.param(n, id=f"nproc={n}", marks=[pytest.mark.skip(reason=reason)] if reason else []))
    metafunc.parametrize(NPROC_ARG, params)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A single size this machine cannot run is skipped at collection, with the reason, like a matrix's."""
    for item in items:
        opts = _options(item)
        if opts is None or opts.matrix:
            continue
        gpus = _gpu_count() if opts.device != "cpu" else 0
        reason = skip_reason(opts.device, opts.sizes[0], gpus, _cores())
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the session server now, so that it imports torch and the test files while other tests run."""
    if session.config.getoption("ddp_cold", False):
        return
    modules = {}
    for item in session.items:
        if item.get_closest_marker("ddp") is not None and item.get_closest_marker("skip") is None \
                and isinstance(item, pytest.Function):
            modules[str(item.path)] = item.module.__name__
    if modules:
        log = Path(tempfile.mkdtemp(prefix="ddpboot-testing-warm-")) / "warm.log"
        slot = _ServerSlot([(name, path) for path, name in modules.items()], log)
        session.config.stash[_SERVER] = slot
        slot.get()


def pytest_unconfigure(config: pytest.Config) -> None:
    slot = config.stash.get(_SERVER, None)
    if slot is not None:
        slot.close()
        shutil.rmtree(slot.log.parent, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    opts = _options(pyfuncitem)
    if opts is None:
        return None
    nproc = _nproc(pyfuncitem)
    gpus = _gpu_count() if opts.device != "cpu" else 0
    reason = skip_reason(opts.device, nproc, gpus, _cores())
    if reason:
        pytest.skip(reason)
    wanted = inspect.signature(pyfuncitem.obj).parameters
    funcargs = {k: v for k, v in pyfuncitem.funcargs.items() if k in wanted}
    owner = f"{pyfuncitem.cls.__name__}." if pyfuncitem.cls is not None else ""
    try:
        job = make_job(str(pyfuncitem.path), pyfuncitem.module.__name__, owner + pyfuncitem.originalname, funcargs,
                       opts.timeout)
    except NotPicklable as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None
    results = Path(tempfile.mkdtemp(prefix="ddpboot-testing-"))
    try:
        write_job(job, results)
        code = _launch(pyfuncitem, opts, nproc, uses_gpus(opts.device, nproc, gpus), results)
        outcomes = read_results(results, nproc)
        log = results / LAUNCHER_LOG
        output = log.read_text(errors="replace") if log.exists() else ""
    finally:
        shutil.rmtree(results, ignore_errors=True)
    timed_out = code is None or any(r.stacks for r in outcomes)
    report = failure_report(outcomes, -1 if code is None else code, output, opts.timeout if timed_out else None)
    if report is not None:
        failed = ",".join(str(r.rank) for r in outcomes if not r.passed)
        pyfuncitem.user_properties.append(("ddp_failed_ranks", failed))
        pytest.fail(report, pytrace=False)
    return True


def _launch(item: pytest.Function, opts: DdpOptions, nproc: int, gpu: bool, results: Path) -> int | None:
    """The launcher's exit code for this job, or None when it ran past the timeout and had to be stopped."""
    slot: _ServerSlot | None = item.config.stash.get(_SERVER, None)
    if slot is not None and not opts.args:
        try:
            return slot.get().run(nproc, gpu, results, opts.timeout)
        except SessionServerError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
    cmd = [sys.executable, "-m", "ddpboot", "--nproc", str(nproc), *([] if gpu else ["--cpu"]),
           "--shutdown-timeout", "5", "--wait-for-gpus", f"{opts.timeout:g}", *opts.args,
           "-m", "ddpboot.testing.rank", str(results)]
    with (results / LAUNCHER_LOG).open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        return proc.wait(timeout=opts.timeout + STOP_AFTER)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher stops its ranks (every one has dumped its stack by now)
    try:
        proc.wait(timeout=GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()  # its guardian kills the ranks
        proc.wait()
    return None
