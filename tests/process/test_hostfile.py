"""Jobs of several hosts from one command (`ddpboot --hostfile FILE`, `--hosts`), over a real OpenSSH server.

The "hosts" are 127.0.0.2 and 127.0.0.3, both served by an sshd the session starts (tests/sshd.py: Debian's sshd,
its own config, host key and client key; the client is the real ssh with a known_hosts made for it), and
`localhost`, which is this machine and starts without ssh. Every host runs one CPU rank (gloo) of
tests/process/scripts/nodes_job.py, copied into the test's directory so that everything a job starts names that
directory: its launchers, tethers, guardians, node links and ranks on every host, which is how a test sees that
nothing is left (`left`). The tests skip, saying why, without root or without sshd (scripts/ci/sshd-up installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.sshd import Sshd, start, unavailable
from tests.support import SCRIPTS, clean_env, ddpboot_exe, finish, free_port, gone, start_launcher, wait_for


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    server = start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def job(tmp_path: Path, sshd: Sshd, hosts: list[str], *extra: str, **env: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a job of one CPU rank per host."""
    (tmp_path / "hosts").write_text("# the test's hosts\n" + "".join(f"{h} slots=1\n" for h in hosts))
    script = tmp_path / "job.py"
    shutil.copy(SCRIPTS / "nodes_job.py", script)
    args = ["--hostfile", str(tmp_path / "hosts"), *sshd.args(), "--master-port", str(free_port()), "--env",
            "NODES_OUT", *(a for name in env for a in ("--env", name)), *extra, str(script)]
    return args, clean_env(NODES_OUT=str(tmp_path), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", **sshd.env(),
                           **env)


def left(tmp_path: Path, sshd: Sshd) -> list[str]:
    """What still runs of the test's job on any host: its processes, and the sshd's sessions."""
    mark = str(tmp_path)
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == me or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if mark in " ".join(p.info["cmdline"] or ()) or any(mark in v for v in p.environ().values()):
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or ())}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    with_sessions = [f"{c.pid} {' '.join(c.cmdline())}" for c in psutil.Process(sshd.proc.pid).children()
                     if c.status() != psutil.STATUS_ZOMBIE]
    return found + with_sessions


def rank_pids(tmp_path: Path, ranks: int, proc: subprocess.Popen[Any]) -> list[int]:
    def written() -> list[int] | None:
        if proc.poll() is not None:
            _, out, err = finish(proc)
            raise AssertionError(f"the job ended early ({proc.returncode}):\n{out}\n{err}")
        paths = [tmp_path / f"rank{r}.json" for r in range(ranks)]
        return [json.loads(p.read_text())["pid"] for p in paths] if all(p.exists() for p in paths) else None

    pids: list[int] = wait_for(written, 120, "every rank to report", interval=0.05)
    return pids


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        finish(proc)


def test_a_job_of_two_hosts_runs_over_ssh_and_exits_0(tmp_path: Path, sshd: Sshd) -> None:
    """`ddpboot --hostfile FILE --ssh-port P --ssh-identity-file KEY --nproc 1 job.py`, hosts 127.0.0.2 and
    127.0.0.3: one 2-rank gloo job (the all-reduce sums both ranks), its lines prefixed by the template with each
    host's name, and nothing left on either host."""
    args, env = job(tmp_path, sshd, ["127.0.0.2", "127.0.0.3"], "--nproc", "1", "--log-line-prefix-template",
                    "${hostname}/${node_rank}/${rank}: ", NODES_SAY="hello")
    proc = start_launcher(args, env)
    code, out, err = finish(proc, 180)
    assert code == 0, out + err
    reps = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert [(reps[r]["rank"], reps[r]["node_rank"], reps[r]["world_size"], reps[r]["sum"]) for r in (0, 1)] == [
        (0, 0, 2, 2.0), (1, 1, 2, 2.0)]
    host = socket.gethostname()
    assert f"{host}/0/0: rank 0 of 2 says hello" in out and f"{host}/1/1: rank 1 of 2 says hello" in out, out
    assert "ddpboot-remote" not in err, err  # the launchers' start marks are taken out of the output
    wait_for(lambda: not left(tmp_path, sshd), 30, "the job's processes to end")


@pytest.mark.parametrize("answer", ["refused", "silent"])
def test_a_host_whose_sshd_does_not_answer_exits_2_naming_it(answer: str, tmp_path: Path, sshd: Sshd) -> None:
    """Node 1's host has no sshd (127.0.0.4: the connection is refused) or one that never answers (a socket that
    takes the connection and says nothing: ssh gives up after its ConnectTimeout, 5 s): exit 2 within 10 s, one
    error naming that host, and node 0's launcher on 127.0.0.2 stopped (nothing left)."""
    silent = socket.socket()
    silent.bind(("127.0.0.4", sshd.port))
    if answer == "silent":
        silent.listen(8)
    try:
        args, env = job(tmp_path, sshd, ["127.0.0.2", "127.0.0.4"], "--nproc", "1", NODES_SLEEP="30")
        t0 = time.monotonic()
        proc = start_launcher(args, env)
        code, out, err = finish(proc, 60)
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("ddpboot: error:")]
    assert len(errors) == 1 and errors[0].startswith("ddpboot: error: 127.0.0.4 (node 1): ssh could not run"), err
    assert "nothing runs on any host" in errors[0], err
    print(f"{answer}: exit 2 after {took:.2f} s")
    assert took < 10
    wait_for(lambda: not left(tmp_path, sshd), 30, "node 0's launcher to end")
    assert not list(tmp_path.glob("rank*.json"))


def test_one_hosts_failure_ends_every_host_with_its_code(tmp_path: Path, sshd: Sshd) -> None:
    """Rank 1 (on 127.0.0.3) exits 3 while rank 0 sleeps: the node link stops node 0, and the one command exits
    3, its hosts' launchers' lines named by host."""
    args, env = job(tmp_path, sshd, ["127.0.0.2", "127.0.0.3"], "--nproc", "1", NODES_SLEEP="60",
                    NODES_FAIL_RANK="1")
    proc = start_launcher(args, env)
    try:
        rank0 = rank_pids(tmp_path, 1, proc)[0]
        wait_for(lambda: (tmp_path / "failed").exists(), 120, "rank 1 to fail")
        failed_at = float((tmp_path / "failed").read_text())
        wait_for(lambda: gone(rank0), 10, "node 0's rank to be stopped", interval=0.01)
        print(f"node 0's rank stopped {time.time() - failed_at:.2f} s after rank 1 failed on the other host")
        code, out, err = finish(proc, 30)
    finally:
        stop(proc)
    assert code == 3, out + err
    assert "ddpboot: 127.0.0.3: rank 1 failed: exit code 3" in err, err
    assert "ddpboot: 127.0.0.2: the job failed on node 1" in err, err
    wait_for(lambda: not left(tmp_path, sshd), 30, "the job's processes to end")


def stopped_by(tmp_path: Path, sshd: Sshd, hosts: list[str], signo: int, bound: float) -> tuple[float, Any]:
    """A job of sleeping ranks on `hosts`, `signo` sent to its command once every rank runs (SIGINT to its process
    group, as a terminal's Ctrl-C; anything else to the command only): the seconds until every host's rank was
    gone (at most `bound`), and the command's (code, out, err) once it ended."""
    args, env = job(tmp_path, sshd, hosts, "--nproc", "1", NODES_SLEEP="60")
    proc = start_launcher(args, env)
    try:
        pids = rank_pids(tmp_path, len(hosts), proc)
        t0 = time.monotonic()
        if signo == signal.SIGINT:
            os.killpg(proc.pid, signo)
        else:
            os.kill(proc.pid, signo)
        wait_for(lambda: all(gone(p) for p in pids), bound, "every host's rank to stop", interval=0.01)
        took = time.monotonic() - t0
        result = finish(proc, 30)
    finally:
        stop(proc)
    wait_for(lambda: not left(tmp_path, sshd), 30, "the job's processes to end")
    return took, result


def test_ctrl_c_stops_every_host_within_2_s(tmp_path: Path, sshd: Sshd) -> None:
    """A terminal's Ctrl-C: every host's launcher gets SIGINT through its tether and stops its ranks; all ranks
    are gone within 2 s, and the command exits 130."""
    took, (code, out, err) = stopped_by(tmp_path, sshd, ["127.0.0.2", "127.0.0.3"], signal.SIGINT, 2)
    print(f"Ctrl-C: every host's rank gone after {took:.2f} s")
    assert code == 130, out + err
    assert "ddpboot: SIGINT: stopping the ranks of every host" in err, err


def test_sigkill_of_the_command_leaves_nothing_on_any_host(tmp_path: Path, sshd: Sshd) -> None:
    """`kill -9` of the command, node 0 on this host (localhost: its launcher started without ssh) and node 1 on
    127.0.0.3: each launcher's stdin ends, its tether stops it, and nothing of the job runs anywhere after."""
    took, (code, _, _) = stopped_by(tmp_path, sshd, ["localhost", "127.0.0.3"], signal.SIGKILL, 30)
    print(f"SIGKILL of the command: every host's rank gone after {took:.2f} s")
    assert code == -signal.SIGKILL


def test_a_dropped_connection_stops_that_hosts_ranks(tmp_path: Path, sshd: Sshd) -> None:
    """Node 1's ssh client killed (its connection drops): node 1's launcher stops its rank (SIGHUP from its tether),
    its node link tells node 0, which stops too; the command exits non-zero and nothing is left."""
    args, env = job(tmp_path, sshd, ["127.0.0.2", "127.0.0.3"], "--nproc", "1", NODES_SLEEP="60")
    proc = start_launcher(args, env)
    try:
        pids = rank_pids(tmp_path, 2, proc)
        clients = [c for c in psutil.Process(proc.pid).children() if "127.0.0.3" in c.cmdline()]
        assert len(clients) == 1, psutil.Process(proc.pid).children()
        clients[0].kill()
        wait_for(lambda: gone(pids[1]), 10, "node 1's rank to stop", interval=0.01)
        wait_for(lambda: gone(pids[0]), 10, "node 0's rank to stop", interval=0.01)
        code, out, err = finish(proc, 30)
    finally:
        stop(proc)
    assert code not in (0, 2), out + err
    wait_for(lambda: not left(tmp_path, sshd), 30, "the job's processes to end")


def test_plan_shows_the_whole_job_as_each_host_plans_it(tmp_path: Path, sshd: Sshd) -> None:
    """`ddpboot plan --hostfile FILE`: every host asked over ssh (with its simulated GPUs, the forwarded
    DDPBOOT_FAKE_GPUS); `--no-probe`: nobody asked."""
    (tmp_path / "hosts").write_text("127.0.0.2 slots=2\n127.0.0.3 slots=2 exclude=0\n")
    env = clean_env(DDPBOOT_FAKE_GPUS="4", COLUMNS="100", **sshd.env())
    base = [*ddpboot_exe(), "plan", "--hostfile", str(tmp_path / "hosts"), *sshd.args()]
    asked = subprocess.run([*base, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stderr
    rows = json.loads(asked.stdout)["hosts"]
    assert [(r["host"], r["node_rank"], r["ranks"], r["gpus"]) for r in rows] == [
        ("127.0.0.2", 0, [0, 1], [[0], [1]]), ("127.0.0.3", 1, [2, 3], [[1], [2]])]
    table = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "world size 4 · 2 nodes from" in table.stdout and "1, 2 (Simulated GPU 80GB)" in table.stdout, table.stdout
    blind = subprocess.run([*base, "--no-probe"], env=env, capture_output=True, text=True, timeout=60)
    assert blind.returncode == 0 and blind.stdout.count("not asked") == 2, blind.stdout + blind.stderr
    (tmp_path / "hosts").write_text("127.0.0.2 slots=2\n127.0.0.4 slots=2\n")  # no sshd on 127.0.0.4
    refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("ddpboot: error: 127.0.0.4 (node 1): ssh could not run ddpboot there"), \
        refused.stderr


def test_dry_run_shows_each_hosts_command_and_what_it_is_sent() -> None:
    """No sshd needed: nothing starts. The first host written `localhost` is this machine (no ssh), and the others
    reach its store at this machine's name; --master-addr overrides that; --env adds a variable."""
    env = clean_env(DDPBOOT_RUN_TAG="t1", MY_SETTING="x")
    base = [*ddpboot_exe(), "--hosts", "localhost:2,gpu02:2", "--cpu", "--dry-run", "--json", "--env", "MY_SETTING",
            "--max-restarts", "0"]
    shown = json.loads(subprocess.run([*base, "nodes_job.py"], env=env, capture_output=True, text=True, timeout=60,
                                      cwd=SCRIPTS).stdout)
    assert shown["store"] == {"master_addr": socket.gethostname(), "port": 29500}
    local, remote = shown["hosts"]
    assert (local["host"], local["local"], remote["host"], remote["local"]) == ("localhost", True, "gpu02", False)
    assert local["argv"][1:3] == ["-m", "ddpboot.cli.remote"] and "ssh" not in local["argv"][0]
    assert remote["argv"][0] == "ssh" and remote["argv"][-2] == "gpu02"
    command = remote["argv"][-1]
    assert command.startswith(f"cd {SCRIPTS} && exec ") and "--node-rank 1 --master-addr" in command, command
    assert command.endswith("--nproc 2 --cpu --max-restarts 0 nodes_job.py"), command
    assert {"MY_SETTING", "DDPBOOT_RUN_TAG", "PATH"} <= set(shown["variables"]), shown["variables"]
    over = json.loads(subprocess.run([*base, "--master-addr", "10.1.2.3", "nodes_job.py"], env=env, capture_output=True,
                                     text=True, timeout=60, cwd=SCRIPTS).stdout)
    assert over["store"]["master_addr"] == "10.1.2.3" and "--master-addr 10.1.2.3" in over["hosts"][1]["argv"][-1]
