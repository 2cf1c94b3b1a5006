"""The launcher with real workers on CPU: the environment contract (against torchrun's), a DDP step, fail-fast,
the shutdown timeout, signal forwarding, no orphans after `kill -9`, restarts with a fresh store.

Workers are tests/process/scripts/launch_*.py. Only the tests about the process group import torch in the workers
(launch_ddp.py); supervision and signal tests use launch_behave.py, which starts in milliseconds. Tests wait for
conditions (files a worker writes, processes gone) with `wait_for`, never for a fixed time. Simulated GPUs
(DDPBOOT_FAKE_GPUS) make CUDA_VISIBLE_DEVICES real UUID strings while the workers run on CPU.

The helpers here are shared by the other test_launcher_*.py modules.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddpboot.selection.inventory import fake_uuid
from tests.support import (
    BEHAVE,
    DDP,
    ENVDUMP,
    SCRIPTS,
    TIMEOUT,
    base_keys,
    descendants,
    finish,
    free_port,
    gone,
    launch_env,
    reports,
    run_launcher,
    start_launcher,
    wait_for,
)

# --- the environment contract ------------------------------------------------------------------------

TORCHRUN_AGREE = (
    "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",
    "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE",
)
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


@pytest.fixture(scope="module")
def torchrun_envs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, str]]:
    out = tmp_path_factory.mktemp("torchrun")
    env = launch_env(out)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         ENVDUMP, "a", "${local_rank}"],  # not torchrun's default port 29500, which another job may hold
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    return {r: d["env"] for r, d in reports(out).items()}


@pytest.mark.parametrize("isolation", ["rank", "node"])
def test_environment_matches_torchrun_key_by_key(
    isolation: str, torchrun_envs: dict[int, dict[str, str]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(
        ["--nproc", "2", "--isolation", isolation, "--signals-to-handle", SIGNALS, ENVDUMP, "a", "${local_rank}"],
        launch_env(out),
    )
    assert proc.returncode == 0, proc.stderr
    ours = {r: d["env"] for r, d in reports(out).items()}
    argv = {r: d["argv"] for r, d in reports(out).items()}
    assert sorted(ours) == sorted(torchrun_envs) == [0, 1]
    base = base_keys()
    uuids = [fake_uuid(0), fake_uuid(1)]
    for rank in (0, 1):
        theirs, mine = torchrun_envs[rank], ours[rank]
        missing = (set(theirs) - base) - set(mine)
        assert not missing, f"torchrun sets {sorted(missing)}, ddpboot does not"
        for key in TORCHRUN_AGREE:
            assert mine[key] == theirs[key], (key, mine[key], theirs[key])
        assert mine["TORCHELASTIC_RUN_ID"] and theirs["TORCHELASTIC_RUN_ID"]
        assert mine["TORCHELASTIC_ERROR_FILE"].endswith(f"rank{rank}.error.json")
        # Where the store is: ours on loopback by address, a port the launcher bound.
        assert mine["MASTER_ADDR"] == "127.0.0.1" and int(mine["MASTER_PORT"]) > 0
        assert mine["MASTER_PORT"] == ours[0]["MASTER_PORT"]
        assert mine["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert mine["DDPBOOT_LOCAL_RANK"] == str(rank)
        assert mine["DDPBOOT_GPU_UUIDS"] == uuids[rank]
        assert mine["DDPBOOT_ISOLATION"] == isolation
        if isolation == "rank":
            assert mine["LOCAL_RANK"] == "0"
            assert mine["CUDA_VISIBLE_DEVICES"] == uuids[rank]
        else:
            assert mine["LOCAL_RANK"] == theirs["LOCAL_RANK"] == str(rank)
            assert mine["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert argv[rank] == ["a", str(rank)]  # ${local_rank} is the true index, as under torchrun


def test_ddp_step_all_reduces_gradients(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", DDP], launch_env(out, tmp_path))
    assert proc.returncode == 0, proc.stderr
    reps = reports(out)
    assert sorted(reps) == [0, 1]
    for r in reps.values():
        assert r["world"] == 2 and r["local_rank"] == 0  # rank isolation: LOCAL_RANK 0 everywhere
        assert r["all_reduce"] == 3.0
        assert r["grad"] == [r["expected"]] * 4  # 2*(1+2)/2 = 3 on every weight: gradients were averaged
        assert r["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # rank 0 too is a client of our store
    assert list(tmp_path.glob("ddpboot-*")) == []


def test_restart_gets_a_fresh_store_and_counts_attempts(tmp_path: Path) -> None:
    """Attempt 0 inits a gloo group and then rank 1 fails; attempt 1 must init again on the same port with none of
    attempt 0's keys, and see TORCHELASTIC_RESTART_COUNT=1."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(out, tmp_path, LAUNCH_TEST_FAIL_AFTER_INIT="0")
    proc = run_launcher(["--nproc", "2", "--max-restarts", "1", "--shutdown-timeout", "5", DDP], env)
    assert proc.returncode == 0, proc.stderr
    assert "attempt 0 failed" in proc.stderr and "planned failure after init" in proc.stderr
    reps = reports(out)
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reps.values()} == {"1"}
    assert all(r["all_reduce"] == 3.0 for r in reps.values())


# --- supervision -------------------------------------------------------------------------------------


def test_fail_fast_returns_the_failing_ranks_code(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc", "2", BEHAVE, "--exit", "1:3", "--hold", "0", "--child", "--await-all"]
    proc = start_launcher(args, launch_env(out))
    code, _, err = finish(proc)
    assert code == 3, err
    assert "rank 1 failed: exit code 3" in err
    assert "rank 0: killed by SIGTERM" in err
    reps = reports(out)
    assert sorted(reps) == [0, 1]
    for r in reps.values():
        assert gone(r["pid"]) and gone(r["child"])


@pytest.mark.parametrize(("how", "code"), [("exit", 3), ("raise", 1), ("crash", 7)])
def test_the_root_cause_is_the_rank_that_began_to_exit_first(how: str, code: int, tmp_path: Path) -> None:
    """Rank 1 fails; its exit tears down the process group and rank 0, waiting in a collective, dies of that and
    reaches the launcher first. ddpboot.init's at-exit mark lets the launcher name rank 1 and return its code. A
    rank that dies of the broken collective writes no mark, so a crash without any teardown stays the root cause."""
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--cpu", str(SCRIPTS / "launch_root_cause.py"), how], launch_env(out))
    assert proc.returncode == code, proc.stderr
    assert f"rank 1 failed: exit code {code}" in proc.stderr, proc.stderr
    if how != "crash":  # rank 0 did exit first, on its own (a crash is seen before rank 0 notices it)
        assert "other ranks: rank 0: exit code 1" in proc.stderr, proc.stderr
    if how == "raise":
        assert "ValueError: rank 1 is the root cause" in proc.stderr


def test_sibling_ignoring_sigterm_is_killed_after_the_shutdown_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc", "2", "--shutdown-timeout", "1", BEHAVE, "--exit", "1:3", "--ignore", "TERM", "--hold", "0",
            "--await-all"]
    start = time.monotonic()
    proc = start_launcher(args, launch_env(out))
    code, _, err = finish(proc)
    took = time.monotonic() - start
    assert code == 3, err
    assert "SIGKILL after 1 s" in err
    assert took >= 1.0  # it did wait for the grace period before SIGKILL
    assert all(gone(r["pid"]) for r in reports(out).values())


def test_signal_exit_codes_and_worker_exit_by_signal(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--no-python", "sh", "-c", 'test "$RANK" = 1 && kill -SEGV $$; exit 0'],
                        launch_env(out))
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    assert "killed by SIGSEGV" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_terminating_signals_are_forwarded_once_and_stop_the_job(sig: signal.Signals, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    name = sig.name[3:]
    proc = start_launcher(
        ["--nproc", "2", BEHAVE, "--count", "USR1", "--stop-on", name, "--hold", "*"], launch_env(out)
    )
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: all(r["received"].get("SIGUSR1") for r in reports(out).values()), 30, "SIGUSR1 at both ranks")
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == 128 + sig, err
    for r in reports(out).values():
        assert r["received"] == {"SIGUSR1": 1, sig.name: 1}, r["received"]
    assert f"received {sig.name} from pid {os.getpid()}" in err


def test_second_sigint_kills_at_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher(
        ["--nproc", "2", "--shutdown-timeout", "300", BEHAVE, "--count", "INT", "--hold", "*"], launch_env(out)
    )
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: all(r["received"].get("SIGINT") for r in reports(out).values()), 30, "SIGINT at both ranks")
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc, timeout=60)  # far below the 300 s grace: the second SIGINT did not wait for it
    assert code == 130, err
    assert "second SIGINT" in err
    assert all(gone(r["pid"]) for r in reports(out).values())


FAKE_SLURMSTEPD = """
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(15, b"slurmstepd", 0, 0, 0)   # PR_SET_NAME: what /proc/PID/comm shows
for pid in map(int, sys.argv[1:]):
    os.kill(pid, signal.SIGUSR1)
"""


def test_forwarding_is_idempotent(tmp_path: Path) -> None:
    """slurmstepd signals every process itself: not forwarded. A burst of the same signal: forwarded once."""
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher(["--nproc", "2", BEHAVE, "--count", "USR1", "--stop-on", "TERM", "--hold", "*"],
                          launch_env(out))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    workers = [r["pid"] for r in reports(out).values()]
    subprocess.run([sys.executable, "-c", FAKE_SLURMSTEPD, str(proc.pid), *map(str, workers)], check=True)
    wait_for(lambda: all(r["received"].get("SIGUSR1") == 1 for r in reports(out).values()), 30, "direct SIGUSR1")
    os.kill(proc.pid, signal.SIGUSR1)
    os.kill(proc.pid, signal.SIGUSR1)  # the same signal again at once: one delivery
    wait_for(lambda: all(r["received"].get("SIGUSR1") == 2 for r in reports(out).values()), 30, "forwarded SIGUSR1")
    (out / "release").touch()
    code, _, err = finish(proc)
    assert code == 0, err
    assert "from slurmstepd" in err and "not forwarded" in err
    assert all(r["received"]["SIGUSR1"] == 2 for r in reports(out).values())


def test_sigkill_of_the_launcher_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start_launcher(["--nproc", "2", BEHAVE, "--child", "--ignore", "TERM", "--hold", "*"],
                          launch_env(out, tmp))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    everything = descendants(proc.pid)  # workers, their children, the guardian
    reps = reports(out)
    assert {r["pid"] for r in reps.values()} | {r["child"] for r in reps.values()} <= set(everything)
    assert list(tmp.glob("ddpboot-*")), "the job's temporary directory exists while it runs"
    proc.kill()
    proc.wait()
    wait_for(lambda: all(gone(p) for p in everything), 10, f"processes {everything} to die")
    wait_for(lambda: not list(tmp.glob("ddpboot-*")), 10, "the temporary directory to be removed")


def test_restarts_count_up_and_return_the_last_attempts_code(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    args = ["--nproc", "2", "--max-restarts", "2", "--log-dir", str(logs), "--rdzv-id", "job",
            BEHAVE, "--exit", "1:4", "--exit-attempts", "2", "--store-probe"]
    proc = run_launcher(args, launch_env(out))
    assert proc.returncode == 0, proc.stderr
    assert "attempt 0 failed" in proc.stderr and "attempt 1 failed" in proc.stderr
    assert sorted(p.name for p in (logs / "job").iterdir()) == ["attempt_0", "attempt_1", "attempt_2", "plan.json"]
    reps = reports(out)
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reps.values()} == {"2"}
    # Each attempt starts from an empty store: at most one rank of an attempt can have seen `probe`.
    assert sum(r["probe_existed"] for r in reps.values()) <= 1

    out2 = tmp_path / "out2"
    out2.mkdir()
    proc = run_launcher(["--nproc", "2", "--max-restarts", "1", BEHAVE, "--exit", "1:5"], launch_env(out2))
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.count("ddpboot: rank 1 failed") == 2
    assert "rank 1 failed on attempt 1 (0 restarts left): exit code 5" in proc.stderr


def test_the_store_listens_on_loopback_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher(["--nproc", "2", BEHAVE, "--hold", "*"], launch_env(out))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    port = int(reports(out)[0]["env"]["MASTER_PORT"])
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    on_port = [c for c in listening if c.laddr.port == port]
    assert on_port and all(c.laddr.ip == "127.0.0.1" for c in on_port), on_port
    ours = {proc.pid, *descendants(proc.pid)}
    assert all(c.laddr.ip == "127.0.0.1" for c in listening if c.pid in ours), [c for c in listening if c.pid in ours]
    (out / "release").touch()
    code, _, err = finish(proc)
    assert code == 0, err


def test_torchs_own_store_serves_as_a_fallback(tmp_path: Path) -> None:
    """`--store torch`: torch's TCPStore server in the guardian, on the same loopback socket, fresh per attempt."""
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc", "2", "--store", "torch", "--max-restarts", "1",
            BEHAVE, "--store-probe", "--exit", "1:4", "--exit-attempts", "1"]
    proc = run_launcher(args, launch_env(out))
    assert proc.returncode == 0, proc.stderr
    reps = reports(out)
    assert {r["env"]["TORCHELASTIC_RESTART_COUNT"] for r in reps.values()} == {"1"}
    assert sum(r["probe_existed"] for r in reps.values()) <= 1


def test_the_launcher_never_imports_torch(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ddpboot", "--nproc", "2", BEHAVE],
                          env=launch_env(out), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "ddpboot.launch.supervisor" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


FOREIGN_THREAD = """
import ctypes, sys
# A native thread with an empty signal mask, unknown to `threading`, as NVML's is in the launcher.
libc = ctypes.CDLL(None)
body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _: libc.sleep(3600))
libc.pthread_create(ctypes.byref(ctypes.c_ulong()), None, body, None)
from ddpboot.cli import main
sys.argv[0] = "ddpboot"
main()
"""


def test_a_thread_that_takes_sigchld_does_not_hang_the_launcher(tmp_path: Path) -> None:
    """Seen on 2×H200: NVML leaves a thread in the launcher with its own signal mask, so process-directed signals
    can be taken by it. The launcher blocks its signals before planning (threads created later inherit that);
    a thread that exists even earlier, as here, may steal a SIGCHLD, and every worker exit must still be seen."""
    out = tmp_path / "out"
    out.mkdir()
    for args, code in ((["--lines", "3", "--linger", "0.3"], 0), (["--exit", "1:3", "--hold", "0"], 3)):
        proc = subprocess.run([sys.executable, "-c", FOREIGN_THREAD, "--nproc", "2", BEHAVE, *args],
                              env=launch_env(out), capture_output=True, text=True, timeout=60)
        assert proc.returncode == code, proc.stderr
