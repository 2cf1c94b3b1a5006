"""Bad input: every case exits 2 with one message naming what was asked, and starts nothing (no worker report,
no temporary directory). Also `--dry-run`, which prints the plan, commands and environments and starts nothing."""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpboot.selection.inventory import fake_uuid
from tests.support import BEHAVE, launch_env, reports, run_launcher


def _bad_script(tmp: Path) -> list[str]:
    return [str(tmp / "nope.py")]


def _directory(tmp: Path) -> list[str]:
    (tmp / "pkgdir").mkdir()
    return [str(tmp / "pkgdir")]


def _not_executable(tmp: Path) -> list[str]:
    path = tmp / "tool.sh"
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return ["--no-python", str(path)]


CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("missing script", _bad_script, "does not exist"),
    ("directory without __main__", _directory, "directory without __main__.py"),
    ("missing module", lambda t: ["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    ("missing submodule", lambda t: ["-m", "json.no_such_part"], "package 'json'"),
    ("package without __main__", lambda t: ["-m", "json"], "package without __main__.py"),
    ("file name given to -m", lambda t: ["-m", "train.py"], "not a module name"),
    ("not a module name", lambda t: ["-m", "my-pkg"], "is not a module name"),
    ("binary not executable", _not_executable, "is not executable"),
    ("binary not on PATH", lambda t: ["--no-python", "no-such-program-xyz"], "no program 'no-such-program-xyz'"),
    ("-m with --no-python", lambda t: ["-m", "--no-python", "json.tool"], "contradict"),
    ("unknown GPU", lambda t: ["--gpus", "5", BEHAVE], "GPU 5 does not exist"),
    ("more ranks than GPUs", lambda t: ["--nproc", "3", BEHAVE], "need 3 free GPUs"),
    ("-t naming a missing rank", lambda t: ["--log-dir", str(t / "l"), "-t", "5:1", BEHAVE], "names local rank 5"),
    ("-r malformed", lambda t: ["--log-dir", str(t / "l"), "-r", "0:7", BEHAVE], "is not RANK:VALUE"),
    ("uncatchable signal", lambda t: ["--signals-to-handle", "SIGKILL", BEHAVE], "cannot be handled"),
    ("unknown signal", lambda t: ["--signals-to-handle", "SIGFOO", BEHAVE], "is not a signal"),
    ("several nodes", lambda t: ["--nnodes", "2", BEHAVE], "multi-node"),
    ("elastic nodes", lambda t: ["--nnodes", "1:4", BEHAVE], "elastic"),
    ("remote endpoint", lambda t: ["--rdzv-endpoint", "example.com:29400", BEHAVE], "another host"),
    ("filter beyond the ranks", lambda t: ["--local-ranks-filter", "5", BEHAVE], "names local rank 5"),
    ("store backend", lambda t: ["--store", "redis", BEHAVE], "--store 'redis'"),
    ("negative restarts", lambda t: ["--max-restarts", "-1", BEHAVE], "--max-restarts -1"),
    ("negative timeout", lambda t: ["--shutdown-timeout", "-1", BEHAVE], "--shutdown-timeout -1"),
    ("start method", lambda t: ["--start-method", "thread", BEHAVE], "--start-method 'thread'"),
    ("unknown option", lambda t: ["--nprocs", "2", BEHAVE], "No such option"),
]


@pytest.mark.parametrize(("what", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_and_starts_nothing(
    what: str, args: Callable[[Path], list[str]], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = run_launcher(["--nproc", "2", *args(tmp_path)], launch_env(out, tmp), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr
    assert reports(out) == {} and list(tmp.iterdir()) == []


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for extra in ([], ["--dry-run"]):
            proc = run_launcher([*extra, "--nproc", "2", "--master-port", str(port), BEHAVE], launch_env(out))
            assert proc.returncode == 2, proc.stderr
            assert f"port {port}" in proc.stderr and "in use" in proc.stderr
    assert reports(out) == {}


def test_dry_run_prints_plan_commands_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--dry-run", "--nproc", "2", BEHAVE, "--lines", "1", "${local_rank}"], launch_env(out))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "world size 2" in text
    for rank in (0, 1):
        assert f"rank {rank} (local rank {rank}): " in text
        assert f"-u {BEHAVE} --lines 1 {rank}" in text
        assert f"  DDPBOOT_LOCAL_RANK={rank}" in text
        assert f"  CUDA_VISIBLE_DEVICES={fake_uuid(rank)}" in text
    assert "  LOCAL_RANK=0" in text and "  TORCHELASTIC_USE_AGENT_STORE=True" in text
    assert "MASTER_PORT='<port bound at launch>'" in text
    assert reports(out) == {}
    assert not os.environ.get("RANK")  # the test process itself is not a worker


def test_torchrun_spellings_pet_defaults_and_entry_points(tmp_path: Path) -> None:
    """Underscore spellings and PET_* defaults mean what they mean to torchrun; -m, --run-path and --no-python run
    the same worker."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "envmod.py").write_text(Path(BEHAVE).read_text())
    env = launch_env(out, PET_NPROC_PER_NODE="2", PET_RDZV_ID="from-pet", PET_MAX_RESTARTS="0")
    runs = [
        ["-m", "envmod"],
        ["--run-path", BEHAVE],
        ["--nproc_per_node", "2", "--max_restarts", "0", "--log_dir", str(tmp_path / "logs"), BEHAVE],
        ["--no-python", sys.executable, BEHAVE],
    ]
    for args in runs:
        for p in out.iterdir():
            p.unlink()
        proc = run_launcher([*args, "--lines", "1"], env, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        reps = reports(out)
        assert sorted(reps) == [0, 1], args
        assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in reps.values()} == {"from-pet"}
        assert all(r["argv"] == ["--lines", "1"] for r in reps.values()), [r["argv"] for r in reps.values()]
    assert (tmp_path / "logs" / "from-pet" / "attempt_0" / "rank1.log").exists()
