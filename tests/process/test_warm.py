"""`--warm`: ranks forked by this user's warm process, kept between launches. Real launches, gloo on CPU.

Most tests share one warm process (the module's `shared` directory), as repeated launches do; those about its
start, its key and its end have their own. Every warm process a test started is ended at the end of the module
(`_end_warm`), found by its socket's directory in its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.process import test_launcher as launcher
from tests.support import (
    SCRIPTS,
    as_uid,
    ddpboot_exe,
    finish,
    gone,
    launch_env,
    reports,
    run_launcher,
    start_launcher,
    wait_for,
)

PROBE = str(SCRIPTS / "warm_probe.py")
pytestmark = pytest.mark.timeout(300)


def warm_env(out: Path, where: Path, **extra: str) -> dict[str, str]:
    return launch_env(out, DDPBOOT_WARM="1", DDPBOOT_WARM_DIR=str(where), **extra)


def status(where: Path) -> dict[str, Any]:
    proc = run_launcher(["warm", "status", "--json"], launch_env(Path("/nonexistent"), DDPBOOT_WARM_DIR=str(where)))
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout)
    return found


def warm_pid(where: Path) -> int:
    s = status(where)
    assert s["running"], s
    return int(s["pid"])


def _end_warm(where: Path) -> None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "warmserver.py" in cmd and str(where) in cmd:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


@pytest.fixture
def own_dir(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "warm"
    yield where
    _end_warm(where)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("shared") / "warm"
    yield where
    _end_warm(where)


def _out(tmp_path: Path, name: str = "out") -> Path:
    out = tmp_path / name
    out.mkdir()
    return out


# --- the script runs as it would cold ------------------------------------------------------------------------


def _probe_in_shell(flags: list[str], out: Path, env: dict[str, str], cwd: Path, umask: str, nofile: int,
                    text: str, code: int = 0) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The probe launched from a shell with this cwd, umask, open-files limit and stdin, and SIGALRM ignored (which
    an exec'd rank inherits, and so must a warm one)."""
    cmd = " ".join(map(_quote, [*ddpboot_exe(), "--nproc", "2", *flags, PROBE, "arg", "${local_rank}"]))
    shell = f"trap '' ALRM; umask {umask}; ulimit -S -n {nofile}; printf %s {_quote(text)} | {cmd}"
    proc = subprocess.run(["sh", "-c", shell], env={**env, "WARM_PROBE_EXIT": str(code)}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return proc, {r: json.loads((out / f"probe{r}.json").read_text()) for r in (0, 1)
                  if (out / f"probe{r}.json").exists()}


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def test_a_warm_rank_sees_what_an_execd_rank_sees(tmp_path: Path, shared: Path) -> None:
    """Two launches from different shells (cwd, umask, limit, stdin, environment) share one warm process; each of
    its ranks sees its own launch's, as an exec'd rank of the same launch does; output and exit codes are theirs."""
    settings = [(tmp_path / "a", "027", 512, "first input", "one", 0),
                (tmp_path / "b", "002", 700, "second input", "two", 3)]
    pids = set()
    for i, (cwd, umask, nofile, text, var, code) in enumerate(settings):
        cwd.mkdir()
        seen = {}
        for mode, flags in (("exec", []), ("warm", ["--warm"])):
            out = _out(tmp_path, f"{mode}{i}")
            env = launch_env(out, DDPBOOT_WARM_DIR=str(shared), WARM_PROBE_VAR=var)
            proc, probes = _probe_in_shell(flags, out, env, cwd, umask, nofile, text, code)
            assert proc.returncode == code, proc.stderr
            assert sorted(probes) == [0, 1], proc.stderr
            lines = sorted(line for line in proc.stdout.splitlines() if "probed" in line)
            assert lines == ["[rank0]: rank 0 probed", "[rank1]: rank 1 probed"], proc.stdout
            assert "[rank1]: rank 1 on stderr" in proc.stderr
            for p in probes.values():
                del p["pid"], p["ppid"]
            seen[mode] = probes
        assert seen["warm"] == seen["exec"]
        assert seen["warm"][0]["stdin"] == text and seen["warm"][0]["umask"] == int(umask, 8)
        assert seen["warm"][1]["nofile"][0] == nofile and seen["warm"][1]["cwd"] == str(cwd)
        assert int(seen["warm"][0]["sigign"], 16) >> (signal.SIGALRM - 1) & 1, seen["warm"][0]["sigign"]
        pids.add(warm_pid(shared))
    assert len(pids) == 1, "both launches were served by one warm process"
    assert status(shared)["launches"] >= 2


# --- the launcher's guarantees -----------------------------------------------------------------------------


@pytest.fixture
def warm_launches(monkeypatch: pytest.MonkeyPatch, shared: Path) -> None:
    """test_launcher's launch_env with DDPBOOT_WARM=1 and the shared warm process."""
    plain = launcher.launch_env

    def with_warm(out: Path, tmp: Path | None = None, **extra: str) -> dict[str, str]:
        return plain(out, tmp, DDPBOOT_WARM="1", DDPBOOT_WARM_DIR=str(shared), **extra)

    monkeypatch.setattr(launcher, "launch_env", with_warm)


SUPERVISION: list[Callable[[Path], None]] = [
    launcher.test_fail_fast_returns_the_failing_ranks_code,
    launcher.test_restarts_count_up_and_return_the_last_attempts_code,
    lambda tmp_path: launcher.test_terminating_signals_are_forwarded_once_and_stop_the_job(signal.SIGTERM, tmp_path),
]


@pytest.mark.usefixtures("warm_launches")
@pytest.mark.parametrize("test", SUPERVISION, ids=["fail_fast", "restarts", "sigterm_forwarded"])
def test_supervision_under_warm(test: Callable[[Path], None], tmp_path: Path, shared: Path) -> None:
    test(tmp_path)
    assert status(shared)["running"]


def _held_job(out: Path, where: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[int, dict[str, Any]]]:
    proc = start_launcher(["--nproc", "2", *extra, launcher.BEHAVE, "--child", "--hold", "*"], warm_env(out, where))
    wait_for(lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 60, "both ranks ready")
    reps = reports(out)
    return proc, reps


def test_sigkill_of_the_launcher_leaves_no_rank_and_says_nothing(tmp_path: Path, shared: Path) -> None:
    """Nothing of the launch outlives it, nothing is printed on its terminal (the session has the launcher's stdout
    and stderr: it must not fall back into the warm process's loop), and the warm process serves the next launch."""
    out = _out(tmp_path)
    proc, reps = _held_job(out, shared)
    before = warm_pid(shared)
    session = {r["ppid"] for r in reps.values()}
    assert len(session) == 1
    everything = [r["pid"] for r in reps.values()] + [r["child"] for r in reps.values()] + list(session)
    proc.kill()
    stdout, stderr = proc.communicate(timeout=60)  # to the end: the session and the ranks hold these pipes too
    wait_for(lambda: all(gone(p) for p in everything), 10, f"the ranks, their children and the session {everything}")
    assert "Traceback" not in stdout + stderr and "a request failed" not in stdout + stderr, stdout + stderr
    log = Path(status(shared)["socket"]).with_suffix(".log").read_text()
    assert "Traceback" not in log and "a request failed" not in log, log
    again = _out(tmp_path, "again")
    proc2 = run_launcher(["--nproc", "2", launcher.BEHAVE], warm_env(again, shared))
    assert proc2.returncode == 0 and sorted(reports(again)) == [0, 1], proc2.stderr
    assert warm_pid(shared) == before, "the warm process itself stays, healthy"


def test_another_number_of_ranks_uses_the_same_warm_process(tmp_path: Path, own_dir: Path) -> None:
    """--nproc changes the OMP_NUM_THREADS ddpboot sets for each rank, not what the warm process was started with;
    a user's own OMP_NUM_THREADS does (torch's thread pools read it at import)."""
    pids, threads = [], []
    for i, nproc in enumerate(("1", "2", "1")):
        out = _out(tmp_path, f"n{i}")
        proc = run_launcher(["--cpu", "--nproc", nproc, launcher.BEHAVE], warm_env(out, own_dir))
        assert proc.returncode == 0 and "fresh" not in proc.stderr, proc.stderr
        threads.append(reports(out)[0]["env"]["OMP_NUM_THREADS"])
        pids.append(warm_pid(own_dir))
    assert len(set(pids)) == 1, pids
    assert len(os.sched_getaffinity(0)) < 2 or threads[0] != threads[1], threads  # the ranks' values did differ
    out = _out(tmp_path, "own")
    proc = run_launcher(["--cpu", "--nproc", "1", launcher.BEHAVE], warm_env(out, own_dir, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    assert "since the launch's OMP_NUM_THREADS differs from the warm process's" in proc.stderr, proc.stderr
    assert warm_pid(own_dir) != pids[0]


def test_sigkill_of_the_session_fails_the_launch(tmp_path: Path, shared: Path) -> None:
    out = _out(tmp_path)
    proc, reps = _held_job(out, shared)
    (session,) = {r["ppid"] for r in reps.values()}
    warm = warm_pid(shared)
    assert psutil.Process(session).ppid() == warm
    os.kill(session, signal.SIGKILL)
    code, _, err = finish(proc, timeout=60)
    assert code == 128 + signal.SIGKILL, err
    assert f"the warm launch's process (pid {session}) died; its ranks are killed with it" in err
    assert all(gone(r["pid"]) and gone(r["child"]) for r in reps.values())
    assert warm_pid(shared) == warm


def test_sigkill_of_the_warm_process_mid_launch(tmp_path: Path, shared: Path) -> None:
    """The launch it serves goes on to its end (and says what happened); the next launch starts a fresh one."""
    out = _out(tmp_path)
    proc, _ = _held_job(out, shared)
    warm = warm_pid(shared)
    os.kill(warm, signal.SIGKILL)
    wait_for(lambda: gone(warm), 10, "the warm process to die")
    (out / "release").touch()
    code, _, err = finish(proc, timeout=60)
    assert code == 0, err
    assert f"warning: the warm process (pid {warm}) died during this launch" in err
    again = _out(tmp_path, "again")
    proc2 = run_launcher(["--nproc", "1", launcher.BEHAVE], warm_env(again, shared))
    assert proc2.returncode == 0, proc2.stderr
    assert "is gone without saying why" in proc2.stderr, proc2.stderr
    assert warm_pid(shared) != warm


# --- nothing stale ------------------------------------------------------------------------------------------

READER = "import wmod, os, json, pathlib; pathlib.Path(os.environ['LAUNCH_TEST_OUT'], 'v').write_text(wmod.VALUE)\n"


def test_a_change_of_what_it_imported_or_of_the_environment_starts_a_fresh_one(tmp_path: Path, own_dir: Path
                                                                               ) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "wmod.py").write_text("VALUE = 'first'\n")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    out = _out(tmp_path)

    def launch(**extra: str) -> tuple[str, str, int]:
        env = warm_env(out, own_dir, PYTHONPATH=str(lib), **extra)
        proc = run_launcher(["--nproc", "1", "--preload", "wmod", str(script)], env)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr, (out / "v").read_text(), warm_pid(own_dir)

    _, value, first = launch()
    err, value, pid = launch()
    assert (value, pid) == ("first", first) and "fresh" not in err
    (lib / "wmod.py").write_text("VALUE = 'edited'\n")
    err, value, pid = launch()
    assert value == "edited" and pid != first
    assert f"a fresh warm process, since {lib / 'wmod.py'} changed since it was imported" in err, err
    err, value, third = launch(PYTORCH_NO_SUCH_SETTING="1")
    assert third != pid and "since the launch's PYTORCH_NO_SUCH_SETTING differs from the warm process's" in err, err
    err, _, fourth = launch(PYTORCH_NO_SUCH_SETTING="1", RANDOM_UNRELATED_VAR="x")
    assert fourth == third, "a variable torch does not read at import keeps the warm process"


def test_a_package_installed_into_the_venv_starts_a_fresh_one(tmp_path: Path, own_dir: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "with_torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # this venv's torch
    out = _out(tmp_path)
    env = warm_env(out, own_dir, PYTHON_EXEC=str(venv / "bin" / "python"))
    pids = []
    for step in range(3):
        if step == 2:
            (site / "newly_installed.py").write_text("")
        proc = run_launcher(["--nproc", "1", launcher.BEHAVE], env)
        assert proc.returncode == 0, proc.stderr
        pids.append(warm_pid(own_dir))
        assert status(own_dir)["python"].startswith(str(venv))
    assert pids[0] == pids[1] != pids[2]
    assert f"since {site} changed since it was imported" in proc.stderr, proc.stderr


# --- one per user, its own user only, and its end ---------------------------------------------------------------


def test_one_warm_process_for_concurrent_first_launches(tmp_path: Path, own_dir: Path) -> None:
    outs = [_out(tmp_path, f"out{i}") for i in range(2)]
    procs = [start_launcher(["--nproc", "1", launcher.BEHAVE], warm_env(out, own_dir)) for out in outs]
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 0, err
    s = status(own_dir)
    assert s["launches"] == 2, s
    assert (own_dir / f"warm-{socket.gethostname().split('.')[0]}.log").read_text().count("ready:") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_another_user_is_refused_and_an_open_directory_is_not_used(tmp_path: Path) -> None:
    """The directory and socket opened up on purpose: the warm process still refuses another uid (SO_PEERCRED)."""
    top = Path(tempfile.mkdtemp(prefix="ddpboot-warm-test-"))  # outside pytest's 0700 directories
    own_dir = top / "warm"
    try:
        _refusals(tmp_path, top, own_dir)
    finally:
        _end_warm(own_dir)
        shutil.rmtree(top, ignore_errors=True)


def _refusals(tmp_path: Path, top: Path, own_dir: Path) -> None:
    out = _out(tmp_path)
    assert run_launcher(["--nproc", "1", launcher.BEHAVE], warm_env(out, own_dir)).returncode == 0
    sock = Path(status(own_dir)["socket"])
    top.chmod(0o755)
    own_dir.chmod(0o755)
    sock.chmod(0o777)

    def ask() -> list[str]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(sock))
        s.sendall(json.dumps({"op": "status"}).encode())
        return [s.recv(1 << 16).decode()]

    (answer,) = as_uid(65534, ask)
    assert json.loads(answer)["op"] == "refused", answer
    assert "refused a connection" in sock.with_suffix(".log").read_text()
    # The launcher itself uses no directory others may enter: it says why and starts cold.
    proc = run_launcher(["--nproc", "1", launcher.BEHAVE], warm_env(out, own_dir))
    assert proc.returncode == 0, proc.stderr
    assert "no warm launch:" in proc.stderr and "may be entered by others (mode 755)" in proc.stderr, proc.stderr
    own_dir.chmod(0o700)


def test_it_exits_after_the_idle_time(tmp_path: Path, own_dir: Path) -> None:
    out = _out(tmp_path)
    proc = run_launcher(["--nproc", "1", "--warm-idle", "1s", launcher.BEHAVE], warm_env(out, own_dir))
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: not status(own_dir)["running"], 30, "the warm process to exit after its idle second")
    last = status(own_dir)["last_exit"]
    assert last["why"] == "idle for 1 s", last
    assert not any(own_dir.glob("*.sock"))


def test_warm_stop_and_status_without_one(tmp_path: Path, own_dir: Path) -> None:
    env = launch_env(tmp_path, DDPBOOT_WARM_DIR=str(own_dir))
    proc = run_launcher(["warm", "status"], env)
    assert proc.returncode == 0 and "no warm process of yours runs on this node" in proc.stdout, proc.stdout
    assert run_launcher(["--nproc", "1", launcher.BEHAVE], warm_env(_out(tmp_path), own_dir)).returncode == 0
    pid = warm_pid(own_dir)
    text = run_launcher(["warm", "status"], env).stdout
    assert f"warm process pid {pid}" in text and "1 launch served" in text, text
    proc = run_launcher(["warm", "stop"], env)
    assert proc.returncode == 0 and f"stopped the warm process (pid {pid})" in proc.stdout, proc.stdout
    wait_for(lambda: gone(pid), 10, "the stopped warm process to exit")
    proc = run_launcher(["warm", "restart"], env)
    assert proc.returncode == 2 and "give status or stop" in proc.stderr, proc.stderr
    shutil.rmtree(own_dir)
