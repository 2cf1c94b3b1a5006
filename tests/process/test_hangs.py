"""Hung gloo jobs diagnosed by the launcher: each is dumped on demand (SIGUSR2, then `ddpboot stacks RUN --json` and
`ddpboot stacks RUN`) and then by `--stall-timeout`, with the right rank and frame named in the summary and the right
rank named by the verdict. py-spy on one job where it is installed; the ranks' faulthandler on the others: registered
by ddpboot.init(), by the fast-start process, and, for hang_plain.py (a script that never imports ddpboot), by the
rank bootstrap, with the launcher run without CAP_SYS_PTRACE (setpriv) so that py-spy is refused."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ddpboot.contract import STACKS_END_LINE
from ddpboot.launch.observe.stacks.collect import BACKEND_VAR, find_py_spy
from ddpboot.launch.observe.stacks.dump import VERDICT_PREFIX
from ddpboot.launch.observe.stacks.find import RunRecord, request_dump
from ddpboot.launch.procs.procstat import start_of
from tests.support import SCRIPTS, ddpboot_exe, free_port, launch_env, run_launcher, wait_for

HANG = str(SCRIPTS / "hang_job.py")
PLAIN = SCRIPTS / "hang_plain.py"
STALL = "10"
CAP_SYS_PTRACE = 19
SETPRIV = shutil.which("setpriv")
VENV = Path(sys.prefix)
# The launcher (and so its ranks) without CAP_SYS_PTRACE. (Where Yama's ptrace_scope is 1 this alone refuses py-spy
# for ranks that are not its children; without Yama the kernel lets a process trace one of the same user and the same
# capabilities, so the test also leaves py-spy out of the environment.)
NO_PTRACE = [SETPRIV, "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--"] if SETPRIV else []


def line(marker: str) -> str:
    """`hang_plain.py:N` for the line marked `# <- marker`."""
    marks = [ln.partition("# <- ")[2].partition(":")[0] for ln in PLAIN.read_text().splitlines()]
    return f"{PLAIN.name}:{marks.index(marker) + 1}"


@dataclass(frozen=True)
class Case:
    script: str
    backend: str  # the one the dumps must use ("py-spy" where it works, else faulthandler)
    options: tuple[str, ...]
    expected: tuple[str, ...]  # what each rank's summary starts with
    verdict: str  # a regular expression the verdict must match
    restricted: bool = False  # a plain install (no py-spy) without CAP_SYS_PTRACE: the bootstrap's faulthandler
    stall: str = STALL  # --stall-timeout: the dumps on demand must come before it (a torch-free start, nothing else)


PY_SPY = "py-spy" if find_py_spy(os.environ) is not None else "faulthandler"
CASES = {
    "barrier": Case(HANG, PY_SPY, (), ("barrier, called from hang_job.py", "not in torch.distributed: sleep_elsewhere"),
                    r"rank 0 waits in barrier at hang_job\.py:\d+; rank 1 is in hang_job\.py:\d+ \(in sleep_elsewhere\)"
                    r", not in a collective: look at rank 1$"),
    "destroy": Case(HANG, "faulthandler", ("--fast-start",),
                    ("destroy_process_group, called from hang_job.py", "not in torch.distributed: sleep_elsewhere"),
                    r"rank 0 waits in destroy_process_group at hang_job\.py:\d+; .*: look at rank 1$"),
    "deadlock": Case(HANG, "faulthandler", (), ("recv, called from hang_job.py", "recv, called from hang_job.py"),
                     r"^all 2 ranks wait in recv at hang_job\.py:\d+: every rank waits for a peer"),
    "data": Case(str(PLAIN), "faulthandler", (), ("all_reduce, called from hang_plain.py", "not in torch.distributed"),
                 re.escape(f"rank 0 waits in all_reduce at {line('data')}; rank 1 is in {line('load')} "
                           "(in load_batch), not in a collective: look at rank 1"), restricted=True, stall="6"),
    "skip": Case(str(PLAIN), "faulthandler", ("--nproc", "3"),
                 ("all_reduce, called from hang_plain.py", "barrier, called from hang_plain.py",
                  "all_reduce, called from hang_plain.py"),
                 re.escape(f"ranks 0, 2 wait in all_reduce at {line('skip all_reduce')}; rank 1 waits in barrier at "
                           f"{line('skip barrier')}: look at rank 1, not where its peers wait"),
                 restricted=True, stall="6"),
    "teardown": Case(str(PLAIN), "faulthandler", (), ("", "destroy_process_group, called from hang_plain.py"),
                     r"^rank 0 exited 0 at \d\d:\d\d:\d\d; rank 1 has waited in destroy_process_group at "
                     + re.escape(line("teardown")) + r" for \d+ s since then: a teardown hang: look at rank 0, "
                     r"which left",
                     restricted=True, stall="6"),
}


def summaries(dump: dict[str, Any]) -> dict[int, str]:
    return {r["rank"]: r["summary"] or "" for r in dump["ranks"]}


def named(dump: dict[str, Any], case: Case) -> bool:
    s = summaries(dump)
    return all(s.get(rank, "").startswith(want) for rank, want in enumerate(case.expected) if want) and bool(
        re.search(case.verdict, dump.get("verdict", "")))


def venv_without_py_spy(tmp: Path) -> Path:
    """This virtual environment's interpreter and packages in a new one without py-spy (none beside the
    interpreter, none on PATH): a plain `pip install ddpboot`. Its python."""
    root = tmp / "venv"
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text((VENV / "pyvenv.cfg").read_text())
    (root / "lib").symlink_to(VENV / "lib")
    python = root / "bin" / "python"
    python.symlink_to(Path(sys.executable).resolve())
    return python


def no_ptrace(pid: int) -> bool:
    caps = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("CapEff:"))
    return not int(caps.split()[1], 16) >> CAP_SYS_PTRACE & 1


@pytest.mark.parametrize("mode", sorted(CASES))
def test_a_hung_job_is_dumped_on_demand_and_at_the_stall_timeout(mode: str, tmp_path: Path) -> None:
    case = CASES[mode]
    # Restricted: py-spy tries and is refused where setpriv can take the capability away; forced off otherwise.
    env = launch_env(tmp_path / "out", tmp_path, **{BACKEND_VAR: "auto" if case.restricted else case.backend})
    exe = ddpboot_exe()
    if case.restricted:  # a plain install: no py-spy anywhere, and the launcher without CAP_SYS_PTRACE
        python = venv_without_py_spy(tmp_path)
        exe = [*NO_PTRACE, str(python), "-m", "ddpboot"]
        env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists())
        probe = ("import os; from ddpboot.launch.observe.stacks.collect import find_py_spy; "
                 "print(find_py_spy(os.environ))")
        assert subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True).stdout == "None\n"
    logs = tmp_path / "logs"
    nproc = [] if "--nproc" in case.options else ["--nproc", "2"]
    args = ["--cpu", *nproc, "--log-dir", str(logs), "--stall-timeout", case.stall, "--shutdown-timeout", "2",
            *case.options, case.script, mode]
    # The launcher's output goes to files: a pipe nobody reads while the test waits would fill with the dumps.
    with (tmp_path / "stderr").open("w") as err_file:
        proc = subprocess.Popen([*exe, *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=err_file, start_new_session=True)
    try:
        record = wait_for(lambda: next(logs.glob("*/launcher.json"), None), 120, "the launcher's record")
        pid = json.loads(record.read_text())["pid"]
        if case.restricted and NO_PTRACE:
            assert no_ptrace(pid)
        rank_logs = [record.parent / "attempt_0" / f"rank{r}.log" for r in range(len(case.expected))]
        wait_for(lambda: all(p.exists() and "ready" in p.read_text() for p in rank_logs), 120, "every rank ready")

        def on_demand() -> tuple[dict[str, Any], Path] | None:  # SIGUSR2 as `ddpboot stacks` sends it
            path = request_dump(RunRecord(pid, "", record.parent, start_of(pid)), 30)
            dump = json.loads(path.read_text()) if path is not None else None
            return (dump, path) if dump is not None and path is not None and named(dump, case) else None

        dump, path = wait_for(on_demand, 60, f"an on-demand dump naming {case.expected} and the verdict",
                              interval=0.2)
        assert re.search(case.verdict, verdict_line(path.with_suffix(".txt").read_text()))
        assert dump["reason"].startswith("SIGUSR2 from pid")
        assert {r["backend"] for r in dump["ranks"]} == {case.backend}
        got = run_launcher(["stacks", str(record.parent), "--json"], env)  # the command, by run directory
        assert got.returncode == 0, got.stderr
        assert named(json.loads(got.stdout), case)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert code != 0
    assert f"no progress for {case.stall} s" in err
    stalled = json.loads(max(logs.glob("*/stacks-*.json"), key=lambda p: p.stat().st_mtime).read_text())
    assert stalled["reason"] == f"no progress for {case.stall} s, --stall-timeout"
    assert named(stalled, case), (summaries(stalled), stalled["verdict"])
    for rank, want in enumerate(case.expected):
        assert f"ddpboot:   rank {rank} (CPU, pid " in err or not want
        assert want in err
    assert re.search(case.verdict, verdict_line(err)), err
    assert STACKS_END_LINE in err
    text = next(logs.glob("*/stacks-1.txt")).read_text()
    assert text.rstrip().splitlines()[-1].startswith(STACKS_END_LINE)
    assert text.rstrip().splitlines()[-2].startswith(VERDICT_PREFIX)


def verdict_line(text: str) -> str:
    """The last verdict in a launcher's or `ddpboot stacks`'s output."""
    lines = [ln for ln in text.splitlines() if ln.startswith(VERDICT_PREFIX)]
    return lines[-1].removeprefix(VERDICT_PREFIX) if lines else ""


def test_the_stacks_command_for_no_running_job_is_one_error(tmp_path: Path) -> None:
    env = launch_env(tmp_path / "out", tmp_path)
    got = run_launcher(["stacks", str(tmp_path)], env)
    assert got.returncode == 2 and got.stderr.startswith("ddpboot: error: RUN ")
    assert "is no running ddpboot job's pid, run id or run directory" in got.stderr


@contextlib.contextmanager
def two_nodes(tmp_path: Path, env: dict[str, str], args: list[str]) -> Iterator[list[Path]]:
    """Two launchers (nodes 0 and 1) of one job of one rank per node on this machine, each with its own --log-dir:
    their launcher.json records, once both are there; both killed afterwards."""
    port = free_port()
    logs = [tmp_path / f"node{n}" for n in (0, 1)]
    procs = []
    try:
        for n in (0, 1):
            node = ["--cpu", "--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port",
                    str(port), "--nproc", "1", "--log-dir", str(logs[n])]
            with (tmp_path / f"stderr{n}").open("w") as err_file:
                procs.append(subprocess.Popen([*ddpboot_exe(), *node, *args], env=env, stdout=subprocess.DEVNULL,
                                              stderr=err_file, start_new_session=True))
        yield [wait_for(partial(launcher_record, d), 120, "a launcher's record") for d in logs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def launcher_record(log_dir: Path) -> Path | None:
    return next(log_dir.glob("*/launcher.json"), None)


def test_a_two_node_verdict_names_the_rank_on_the_other_node(tmp_path: Path) -> None:
    """Two launchers (nodes) of one job on this machine, one rank each: rank 1, on node 1, sleeps in its data
    loading while rank 0 waits in all_reduce. Node 1's dump writes where its rank is into node 0's store; node 0's
    verdict then names rank 1 and its node."""
    env = launch_env(tmp_path / "out", tmp_path, **{BACKEND_VAR: "faulthandler"})
    with two_nodes(tmp_path, env, ["--stall-timeout", "300", str(PLAIN), "data"]) as records:
        pids = [json.loads(r.read_text())["pid"] for r in records]
        rank_logs = [records[n].parent / "attempt_0" / f"rank{n}.log" for n in (0, 1)]
        wait_for(lambda: all(p.exists() and "ready" in p.read_text() for p in rank_logs), 120, "both ranks ready")
        node1 = request_dump(RunRecord(pids[1], "", records[1].parent, start_of(pids[1])), 30)
        assert node1 is not None and json.loads(node1.read_text())["ranks"][0]["summary"].startswith(
            "not in torch.distributed")
        want = re.escape(f"rank 0 waits in all_reduce at {line('data')}; rank 1 is in {line('load')} (in load_batch), "
                         "not in a collective: look at rank 1; rank 1 runs on node 1")
        node0 = request_dump(RunRecord(pids[0], "", records[0].parent, start_of(pids[0])), 30)
        assert node0 is not None
        assert re.fullmatch(want, json.loads(node0.read_text())["verdict"]), json.loads(node0.read_text())["verdict"]
        got = run_launcher(["stacks", str(records[0].parent), "--json"], env)
        assert got.returncode == 0, got.stderr
        assert re.fullmatch(want, json.loads(got.stdout)["verdict"])
        assert re.search(want, verdict_line(node0.with_suffix(".txt").read_text()))


FLIGHT = SCRIPTS / "flight_behind.py"


def flight_line(marker: str) -> str:
    """`flight_behind.py:N` for the line marked `# <- marker`."""
    marks = [ln.partition("# <- ")[2].partition(":")[0] for ln in FLIGHT.read_text().splitlines()]
    return f"{FLIGHT.name}:{marks.index(marker) + 1}"


@pytest.mark.parametrize("mode", ["behind", "reorder"])
def test_the_failure_report_reads_the_flight_recorder_s_dumps(mode: str, tmp_path: Path) -> None:
    """Real dumps of torch's flight recorder (gloo records as NCCL does; the ranks write torch's dump where the
    launcher told NCCL to): the failure report's verdict names the rank behind by the sequence numbers, or the
    collective whose number differs between the ranks."""
    env = launch_env(tmp_path / "out", tmp_path)
    logs = tmp_path / "logs"
    got = run_launcher(["--cpu", "--nproc", "2", "--log-dir", str(logs), "--shutdown-timeout", "2", str(FLIGHT),
                        *([mode] if mode != "behind" else [])], env)
    assert got.returncode == 1, got.stderr[-3000:]
    assert sorted(p.name for p in logs.glob("*/attempt_0/nccl_trace_rank_*")) == ["nccl_trace_rank_0",
                                                                                  "nccl_trace_rank_1"]
    if mode == "behind":
        # gloo retires a collective that timed out as one that completed: `returned` (flight.py), once it is
        want = re.escape("flight recorder: rank 1 is behind in process group 0 (default_pg): its last collective is "
                         f"broadcast #3 at {flight_line('broadcast')} (returned); rank 0 is at all_reduce #4 at "
                         f"{flight_line('behind')} (") + r"(returned|not completed)" + re.escape(
                         "); rank 1 never called all_reduce #4: look at rank 1")
    else:
        want = re.escape("flight recorder: collective #4 of process group 0 (default_pg) differs between ranks: rank 0 "
                         f"called all_reduce at {flight_line('behind')}; rank 1 called broadcast at "
                         f"{flight_line('reorder')} (a reordered or skipped collective)")
    assert re.fullmatch(want, verdict_line(got.stderr)), got.stderr[-3000:]


def test_a_dump_on_demand_has_the_flight_recorder_s_finding(tmp_path: Path) -> None:
    """While the job still runs after its ranks dumped (rank 0 holds), `ddpboot stacks --json` adds the dumps'
    finding to the stacks' verdict."""
    env = launch_env(tmp_path / "out", tmp_path, **{BACKEND_VAR: "faulthandler"})
    logs = tmp_path / "logs"
    with (tmp_path / "stderr").open("w") as err_file:
        proc = subprocess.Popen([*ddpboot_exe(), "--cpu", "--nproc", "2", "--log-dir", str(logs), "--shutdown-timeout",
                                 "2", str(FLIGHT), "hold"], env=env, stdout=subprocess.DEVNULL, stderr=err_file,
                                start_new_session=True)
    try:
        record = wait_for(lambda: next(logs.glob("*/launcher.json"), None), 120, "the launcher's record")
        wait_for(lambda: len(list(record.parent.glob("attempt_0/nccl_trace_rank_*"))) == 2, 120, "both dumps",
                 interval=0.1)
        got = run_launcher(["stacks", str(record.parent), "--json"], env)
        assert got.returncode == 0, got.stderr
        dump = json.loads(got.stdout)
        assert dump["flight"]["kind"] == "behind" and dump["flight"]["look_at"] == [1], dump["flight"]
        assert "; flight recorder: rank 1 is behind in process group 0 (default_pg)" in dump["verdict"]
        assert 1 in dump["look_at"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_two_node_flight_recorder_verdict_compares_the_dumps_of_both_nodes(tmp_path: Path) -> None:
    """Two launchers (nodes) of one job, one rank each, each rank's dump in its own node's attempt directory: node
    1's dump on demand carries its rank's dump through the store, so node 0's verdict names rank 1 as behind instead
    of saying that rank 1 has no dump."""
    env = launch_env(tmp_path / "out", tmp_path, **{BACKEND_VAR: "faulthandler"})
    with two_nodes(tmp_path, env, ["--shutdown-timeout", "2", str(FLIGHT), "hold"]) as records:
        for n in (0, 1):
            dumped = records[n].parent / "attempt_0" / f"nccl_trace_rank_{n}"
            wait_for(dumped.exists, 120, f"rank {n}'s dump", interval=0.1)
        pids = [json.loads(r.read_text())["pid"] for r in records]
        node1 = request_dump(RunRecord(pids[1], "", records[1].parent, start_of(pids[1])), 30)
        assert node1 is not None
        assert json.loads(node1.read_text())["flight"]["kind"] == "level"  # gloo's dumps name no group's members
        node0 = request_dump(RunRecord(pids[0], "", records[0].parent, start_of(pids[0])), 30)
        assert node0 is not None
        flight = json.loads(node0.read_text())["flight"]
        assert flight["kind"] == "behind" and flight["look_at"] == [1], flight
        assert flight["verdict"].startswith("rank 1 is behind in process group 0 (default_pg): its last collective "
                                            f"is broadcast #3 at {flight_line('broadcast')}"), flight
        assert "no dump from" not in flight["verdict"]
