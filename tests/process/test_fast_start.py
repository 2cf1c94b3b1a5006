"""`--fast-start`: the same scripts under exec and under fast start (ranks forked from one process that imported
torch) must behave the same. Real launches, gloo on CPU, simulated GPUs for CUDA_VISIBLE_DEVICES.

- tests/process/scripts/fidelity/probe.py reports everything a rank can observe about how it was started (argv,
  sys.path[0], __main__, the environment contract, signal dispositions and mask, stdio buffering, torch's thread
  count, a relative import, pickling a class of the script, multiprocessing pools and DataLoader workers with the
  fork and spawn start methods, a gloo all_reduce); the two modes' reports must be equal.
- exit_probe.py: sys.exit(n), an uncaught exception's traceback, KeyboardInterrupt, a SIGTERM handler, atexit and a
  non-daemon thread outliving the main module.
- fidpkg.main under -m; the accelerate and Lightning (Fabric) clients.
- tests/process/scripts/boot_probe.py forked by the zygote against plain python (test_bootstrap.py compares the
  exec'd rank so): a symlinked script, a module, a directory and a zip file with a __main__.py, with and without -P.
- The launcher's supervision tests (test_launcher.py) whose outcome depends on how the ranks were started, rerun
  with DDPBOOT_FAST_START=1: exit codes and the root cause (fail-fast), SIGTERM and SIGKILL reaching forked ranks
  (the shutdown timeout, signal forwarding), no process left after kill -9 of the launcher, and a restart that
  forks fresh ranks into a fresh store. The launcher's own decisions, which never look at how a rank was started
  (a second Ctrl-C, slurmstepd's signals not forwarded again, counting restarts), are tested once, in
  test_launcher.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddpboot.launch.faststart import FastStartProcess
from ddpboot.launch.spec import Target
from tests.process import test_launcher as launcher
from tests.support import SCRIPTS, finish, launch_env, reports, run_launcher, start_launcher, wait_for

FID = Path(__file__).resolve().parent / "scripts" / "fidelity"
PROBE = str(FID / "probe.py")
EXIT = str(FID / "exit_probe.py")
MODES = {"exec": [], "fast": ["--fast-start"]}
PREFIX = re.compile(r"^\[rank\d+\]: ", re.M)

pytestmark = pytest.mark.timeout(300)


def run_both(tmp_path: Path, args: list[str], cwd: Path | None = None, **extra: str) -> dict[str, Any]:
    """Run `ddpboot ARGS` in both modes; per mode: (completed process, the FID_OUT directory)."""
    results = {}
    for mode, flags in MODES.items():
        out = tmp_path / mode
        out.mkdir()
        env = launch_env(out, FID_OUT=str(out), **extra)
        results[mode] = (run_launcher([*flags, *args], env, cwd=cwd), out)
    return results


def load(out: Path, pattern: str) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob(pattern))}


def test_probe_sees_the_same_process_under_exec_and_fast_start(tmp_path: Path) -> None:
    res = run_both(tmp_path, ["--nproc", "2", PROBE, "alpha", "${local_rank}"])
    for mode, (proc, _) in res.items():
        assert proc.returncode == 0, f"{mode}:\n{proc.stderr}"
    exec_reps, fast_reps = load(res["exec"][1], "rank*.json"), load(res["fast"][1], "rank*.json")
    assert sorted(exec_reps) == sorted(fast_reps) == ["rank0.json", "rank1.json"]
    for name, ex in exec_reps.items():
        fa = fast_reps[name]
        rank = ex["rank"]
        assert ex["allreduce"] == [3.0, 3.0, 3.0]
        assert ex["argv"] == [PROBE, "alpha", str(rank)]
        assert ex["sibling"] == "sibling imported" and ex["pickled"] == "Point" and ex["pickle_module"] == "__main__"
        assert ex["pool_fork"] == ex["pool_spawn"] == [1, 4, 9]
        assert ex["loader_fork"] == ex["loader_spawn"] == list(range(8))
        assert ex["torch_threads"] == int(ex["env"]["OMP_NUM_THREADS"])
        for env in (ex["env"], fa["env"]):  # the runs' own output directories
            del env["FID_OUT"], env["LAUNCH_TEST_OUT"]
        for key in ex:
            if key in ("random", "numpy_random"):
                continue
            assert fa[key] == ex[key], f"rank {rank}: {key} differs\n  exec: {ex[key]!r}\n  fast: {fa[key]!r}"
    for reps in (exec_reps, fast_reps):  # every process seeds its own generators: ranks draw different numbers
        assert reps["rank0.json"]["random"] != reps["rank1.json"]["random"]
        assert reps["rank0.json"]["numpy_random"] != reps["rank1.json"]["numpy_random"]


def test_module_target(tmp_path: Path) -> None:
    res = run_both(tmp_path, ["--nproc", "1", "-m", "fidpkg.main", "x"], cwd=FID)
    for mode, (proc, _) in res.items():
        assert proc.returncode == 0, f"{mode}:\n{proc.stderr}"
    ex, fa = load(res["exec"][1], "module*.json"), load(res["fast"][1], "module*.json")
    assert ex == fa
    rep = ex["module0.json"]
    assert rep["argv"] == [str(FID / "fidpkg" / "main.py"), "x"]
    assert rep["name"] == "__main__" and rep["spec"] == "fidpkg.main" and rep["path0"] == str(FID)


APP_MAIN = ("import sys; print(sys.argv, sys.path[:2], __file__, __name__, __spec__.name, type(__loader__).__name__, "
            "sorted(k for k in globals() if k.startswith('__')))\n")
FORK_CASES = {  # a target, and the words plain python is given for it after -u
    "script": (Target("script", "link.py", ("report",)), ["link.py", "report"]),
    "raise": (Target("script", "link.py", ("raise",)), ["link.py", "raise"]),
    "late": (Target("script", "link.py", ("late",)), ["link.py", "late"]),
    "module": (Target("module", "boot_probe", ("report",)), ["-m", "boot_probe", "report"]),
    "directory": (Target("script", "app", ("x",)), ["app", "x"]),
    "zip": (Target("script", "app.zip", ("x",)), ["app.zip", "x"]),
}


def _forked(zygote: FastStartProcess, target: Target, env: dict[str, str], out: Path) -> tuple[int, str, str]:
    """`target` run in a rank the zygote forks: its exit code, stdout and stderr."""
    with (out / "out").open("wb") as o, (out / "err").open("wb") as e:
        pid = zygote.fork_rank(target, 0, env, o.fileno(), e.fileno())
    exits: list[tuple[int, int]] = []
    wait_for(lambda: exits.extend(x for x in zygote.poll() if x[0] == pid) or exits, 60, "the forked rank's exit")
    return os.waitstatus_to_exitcode(exits[0][1]), (out / "out").read_text(), (out / "err").read_text()


def _without_loaded(output: str) -> str:
    """boot_probe's report without `loaded`: the zygote imported torch, which imports what plain python has not."""
    if not output.startswith("{"):
        return output
    report = json.loads(output)
    del report["loaded"]
    return json.dumps(report)


@pytest.mark.parametrize("safe", ["", "1"], ids=["path0", "safe-path"])
def test_a_forked_rank_runs_its_target_as_plain_python_does(safe: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """launch/pymain.py, the one way the exec'd and the forked rank run their target: what a target forked by the
    zygote sees (argv, orig_argv, sys.path[0], __main__, pickling, a spawn pool, the traceback, atexit) is what plain
    `python -u` gives it, for each kind of target, and under PYTHONSAFEPATH=1 (python -P) too."""
    (tmp_path / "link.py").symlink_to(SCRIPTS / "boot_probe.py")
    (tmp_path / "boot_probe.py").symlink_to(SCRIPTS / "boot_probe.py")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(APP_MAIN)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", APP_MAIN)
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONSAFEPATH": safe}
    zygote = FastStartProcess.start(sys.executable, FORK_CASES["script"][0], tmp_path, env)
    try:
        for case, (target, words) in FORK_CASES.items():
            plain = subprocess.run([sys.executable, "-u", *words], env=env, capture_output=True, text=True,
                                   timeout=60)
            (tmp_path / case).mkdir()
            code, out, err = _forked(zygote, target, env, tmp_path / case)
            assert (code, _without_loaded(out), err) == (plain.returncode, _without_loaded(plain.stdout),
                                                         plain.stderr), case
            if case == "module":
                assert plain.returncode == (1 if safe else 0), plain.stderr  # -P: the working directory is not on it
            elif case != "raise":
                assert plain.returncode == 0, plain.stderr
    finally:
        zygote.close()


def _rank_output(text: str) -> list[str]:
    """What the rank printed: the launcher's own lines, and its failure summary at the end, left out."""
    lines = []
    for ln in PREFIX.sub("", text).splitlines():
        if ln.startswith("ddpboot: rank"):
            break
        if not ln.startswith("ddpboot"):
            lines.append(ln)
    return lines


@pytest.mark.parametrize(
    ("args", "code"),
    [(["exit", "7"], 7), (["raise"], 1), (["interrupt"], 128 + signal.SIGINT), (["late"], 0)],
    ids=["sys.exit", "uncaught-exception", "keyboard-interrupt", "atexit-and-threads"],
)
def test_how_a_rank_ends(args: list[str], code: int, tmp_path: Path) -> None:
    res = run_both(tmp_path, ["--nproc", "1", "--no-prefix", EXIT, *args])
    outputs = {}
    for mode, (proc, out) in res.items():
        assert proc.returncode == code, f"{mode}:\n{proc.stderr}"
        outputs[mode] = (_rank_output(proc.stdout), _rank_output(proc.stderr))
        if args == ["late"]:
            assert (out / "thread0").read_text() == "done"
            assert (out / "atexit0").read_text() == "thread first"
    assert outputs["exec"] == outputs["fast"]
    assert outputs["exec"][0][0] == f"rank 0 starts: {args[0]}"
    if args == ["raise"]:
        assert any(ln.startswith("Traceback") for ln in outputs["fast"][1])
        err = res["fast"][0].stderr
        assert "Traceback (most recent call last):" in err and "ValueError: boom from the script" in err
        assert f'File "{EXIT}", line' in err and ", in fail" in err
        assert "zygote" not in err and "runpy" not in err


@pytest.mark.parametrize("mode", list(MODES))
def test_a_scripts_sigterm_handler_runs(mode: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher([*MODES[mode], "--nproc", "2", "--no-prefix", EXIT, "sigterm"],
                          launch_env(out, FID_OUT=str(out)))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    proc.send_signal(signal.SIGTERM)
    code, stdout, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert sorted(ln for ln in stdout.splitlines() if "got signal" in ln) == [
        f"rank {r} got signal {int(signal.SIGTERM)}" for r in (0, 1)]


@pytest.mark.parametrize("client", ["accelerate", "lightning"])
def test_accelerate_and_lightning_clients(client: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate" if client == "accelerate" else "lightning_fabric")
    res = run_both(tmp_path, ["--nproc", "2", "--cpu", str(FID / "clients.py"), client])
    for mode, (proc, _) in res.items():
        assert proc.returncode == 0, f"{mode}:\n{proc.stderr}"
    ex, fa = load(res["exec"][1], f"{client}*.json"), load(res["fast"][1], f"{client}*.json")
    assert ex == fa
    assert [r["rank"] for r in ex.values()] == [0, 1] and all(r["world"] == 2 for r in ex.values())


# --- the launcher's own tests, with fast start ---------------------------------------------------------

SUPERVISION: list[Callable[..., None]] = [
    launcher.test_fail_fast_returns_the_failing_ranks_code,
    functools.partial(launcher.test_the_root_cause_is_the_rank_that_began_to_exit_first, "exit", 3),
    launcher.test_sibling_ignoring_sigterm_is_killed_after_the_shutdown_timeout,
    launcher.test_sigkill_of_the_launcher_leaves_no_process,
    launcher.test_restart_gets_a_fresh_store_and_counts_attempts,
]


@pytest.fixture
def fast_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """test_launcher's launch_env with DDPBOOT_FAST_START=1: its tests then run every rank forked."""
    plain = launcher.launch_env

    def with_fast_start(out: Path, tmp: Path | None = None, **extra: str) -> dict[str, str]:
        return plain(out, tmp, DDPBOOT_FAST_START="1", **extra)

    monkeypatch.setattr(launcher, "launch_env", with_fast_start)


@pytest.mark.usefixtures("fast_env")
@pytest.mark.parametrize("test", SUPERVISION, ids=[getattr(t, "func", t).__name__.removeprefix("test_")
                                                   for t in SUPERVISION])
def test_supervision_under_fast_start(test: Callable[[Path], None], tmp_path: Path) -> None:
    test(tmp_path)


@pytest.mark.usefixtures("fast_env")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_forwarding_under_fast_start(sig: signal.Signals, tmp_path: Path) -> None:
    launcher.test_terminating_signals_are_forwarded_once_and_stop_the_job(sig, tmp_path)


def test_ranks_are_forked_by_the_zygote(tmp_path: Path) -> None:
    """DDPBOOT_FAST_START=1 does fork every rank from one zygote (so the tests above did test fast start), and the
    zygote ends with the job."""
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher(["--nproc", "2", launcher.BEHAVE, "--hold", "*"],
                          launch_env(out, DDPBOOT_FAST_START="1"))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    parents = {r["ppid"] for r in reports(out).values()}
    assert len(parents) == 1
    zygote = psutil.Process(parents.pop())
    assert zygote.ppid() == proc.pid and "__ddpboot_zygote__" in " ".join(zygote.cmdline())
    (out / "release").touch()
    code, _, err = finish(proc)
    assert code == 0, err
    wait_for(lambda: not psutil.pid_exists(zygote.pid) or zygote.status() == psutil.STATUS_ZOMBIE, 10,
             "the zygote to exit")


def test_fallbacks_and_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(out)
    proc = run_launcher(["--fast-start", "--nproc", "1", "--no-python", "true"], env)
    assert proc.returncode == 0 and "starts with exec as usual" in proc.stderr, proc.stderr
    proc = run_launcher(["--preload", "numpy", "--nproc", "1", launcher.BEHAVE], env)
    assert proc.returncode == 2 and "only with --fast-start" in proc.stderr, proc.stderr
    proc = run_launcher(["--fast-start", "--preload", "numpy,no-such", "--nproc", "1", launcher.BEHAVE], env)
    assert proc.returncode == 2 and "'no-such' is not a module name" in proc.stderr, proc.stderr
    # A preload that cannot be found: exit 2 before anything starts.
    proc = run_launcher(["--fast-start", "--preload", "ddpboot_no_such_module", "--nproc", "2", launcher.BEHAVE],
                        env)
    assert proc.returncode == 2 and "no module 'ddpboot_no_such_module'" in proc.stderr, proc.stderr
    assert not reports(out)
    # A preload that is found but fails to import: said once, and the job still runs (with exec).
    (tmp_path / "ddpboot_bad_preload.py").write_text("raise ImportError('broken on purpose')\n")
    proc = run_launcher(["--fast-start", "--preload", "ddpboot_bad_preload", "--nproc", "2", launcher.BEHAVE],
                        {**env, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "fast start unavailable" in proc.stderr and "broken on purpose" in proc.stderr
    assert sorted(reports(out)) == [0, 1]
