"""The destroy-in-finally NCCL hang, diagnosed by ddpboot: the job ends at --stall-timeout with every rank's stack in
the run directory and a summary line per rank naming a torch.distributed call (scripts/gpu-hang-diag.sh is the
longer version, with the on-demand dump and the faulthandler backend).

On 2 GPUs: one launcher, 2 ranks. On one GPU: two launchers on this machine as the two nodes of a job, one rank
each on the same GPU. NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"); a distinct
NCCL_HOSTID per node makes it take them for two hosts, joined by its socket transport on loopback, as two
machines of one GPU each would be. There the leaving rank's destroy_process_group returns, and only its peer
hangs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from ddpboot.contract import STACKS_END_LINE
from tests.support import REPO, clean_env, ddpboot_exe, free_port, gpu_count, wait_for

pytestmark = pytest.mark.gpu
STALL = "20"

JOB = """
import sys, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
rank, t = dist.get_rank(), torch.ones(1, device="cuda")
try:
    dist.all_reduce(t); torch.cuda.synchronize()
    print(f"rank {rank}: first all_reduce done", flush=True)
    if rank == 1:
        sys.exit(3)
    dist.all_reduce(t); torch.cuda.synchronize()  # rank 0 waits for rank 1, which is leaving
finally:
    dist.destroy_process_group()
"""


def _check_stalled(stderr: str, logs: Path, ranks: dict[int, tuple[str, ...]]) -> None:
    """The launcher stopped at the stall timeout, printed one summary line per rank naming one of `ranks[r]`'s
    calls, and left a complete stacks file with every rank's section in its run directory."""
    assert f"no progress for {STALL} s" in stderr, stderr[-4000:]
    after = stderr[stderr.index(f"no progress for {STALL} s"):]  # not the on-demand dumps before it
    summary = [line for line in after.splitlines() if line.startswith("ddpboot:   rank ")]
    assert len(summary) == len(ranks), stderr[-4000:]
    for line, (rank, calls) in zip(summary, sorted(ranks.items()), strict=True):
        assert line.startswith(f"ddpboot:   rank {rank} ") and any(c in line for c in calls), summary
    text = max(logs.glob("*/stacks-*.txt"), key=lambda p: int(p.stem.partition("-")[2]))  # the stall's: the last
    assert text.read_text().rstrip().splitlines()[-1].startswith(STACKS_END_LINE)
    assert all(f"--- rank {rank} " in text.read_text() for rank in ranks)


def test_the_destroy_in_finally_hang_ends_at_the_stall_timeout_with_every_stack(tmp_path: Path) -> None:
    gpus = gpu_count()
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {gpus}")
    job = tmp_path / "hang.py"
    job.write_text(JOB)
    logs = tmp_path / "logs"
    env = clean_env(NCCL_NVLS_ENABLE="0")
    out = subprocess.run([*ddpboot_exe(), "--nproc", "2", "--log-dir", str(logs), "--stall-timeout", STALL,
                          "--shutdown-timeout", "5", str(job)], env=env, capture_output=True, text=True,
                         timeout=400, cwd=REPO)
    _check_stalled(out.stderr, logs, {0: ("all_reduce", "destroy_process_group", "wait"),
                                      1: ("destroy_process_group", "wait", "barrier")})


def _record(logs: Path) -> Path | None:
    return next(logs.glob("*/launcher.json"), None)


def _summaries(run: Path, env: dict[str, str], want: tuple[int, tuple[str, ...]]) -> dict[int, str] | None:
    """`ddpboot stacks RUN --json`: each rank's one-line summary, once rank `want[0]`'s starts with one of
    `want[1]`; None before."""
    got = subprocess.run([*ddpboot_exe(), "stacks", str(run), "--json"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    if got.returncode != 0:
        return None
    summaries = {r["rank"]: r["summary"] or "" for r in json.loads(got.stdout)["ranks"]}
    rank, calls = want
    return summaries if summaries.get(rank, "").startswith(calls) else None


HANG_ON_NODE_1 = JOB.replace("sys.exit(3)", "import time; time.sleep(3600)  # alive, never in the collective")


Launchers = list[subprocess.Popen[bytes]]


def _two_nodes(tmp_path: Path, job: str, stall: tuple[str, str]) -> tuple[Launchers, list[dict[str, str]]]:
    """Two launchers, one rank each on GPU 0, as two single-GPU machines run a job: distinct NCCL_HOSTIDs, NCCL's
    socket transport on loopback. `stall`: each node's --stall-timeout."""
    script = tmp_path / "hang.py"
    script.write_text(job)
    port = free_port()
    launchers, envs = [], []
    for node in (0, 1):
        env = clean_env(NCCL_NVLS_ENABLE="0", NCCL_HOSTID=f"ddpboot-test-node-{node}", NCCL_SOCKET_IFNAME="lo",
                        NCCL_IB_DISABLE="1", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
        args = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--nproc", "1", "--gpus", "0", "--share", "--log-dir", str(tmp_path / f"logs{node}"),
                "--stall-timeout", stall[node], "--shutdown-timeout", "5", str(script)]
        with (tmp_path / f"stderr{node}").open("w") as err:  # files: a pipe nobody reads could fill with dumps
            launchers.append(subprocess.Popen([*ddpboot_exe(), *args], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                                              stderr=err, start_new_session=True))
        envs.append(env)
    return launchers, envs


def _past_first_all_reduce(tmp_path: Path) -> Path:
    """Node 0's run directory, once its rank printed that its first all_reduce is done."""
    run: Path = wait_for(partial(_record, tmp_path / "logs0"), 120, "node 0's run directory").parent
    wait_for(lambda: "first all_reduce done" in (run / "attempt_0" / "rank0.log").read_text(errors="replace")
             if (run / "attempt_0" / "rank0.log").exists() else False, 180, "rank 0 past its first all_reduce")
    return run


def _end(launchers: Launchers, timeout: float) -> list[int]:
    try:
        return [proc.wait(timeout=timeout) for proc in launchers]
    finally:
        for proc in launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_a_rank_failing_on_the_other_node_ends_this_node_at_once(tmp_path: Path) -> None:
    """Over NCCL's socket transport rank 1's destroy_process_group returns and it exits 3; rank 0's all_reduce kernel
    would wait for it for good (the host in the torch.cuda.synchronize() after it), until NCCL's 10-minute timeout.
    The node link ends node 0 within seconds, far inside the stall timeout, with rank 1's code and a line naming
    node 1's failure."""
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    launchers, _ = _two_nodes(tmp_path, JOB, (STALL, STALL))
    try:
        _past_first_all_reduce(tmp_path)
        hung_at = time.monotonic()
    finally:
        codes = _end(launchers, float(STALL) * 3 + 60)
    ended = time.monotonic() - hung_at
    errs = [(tmp_path / f"stderr{n}").read_text() for n in (0, 1)]
    assert codes[1] == 3 and "ddpboot: rank 1 failed: exit code 3" in errs[1], errs[1][-3000:]
    assert codes[0] == 3 and "the job failed on node 1" in errs[0], errs[0][-3000:]
    assert ended < float(STALL) and f"no progress for {STALL} s" not in errs[0], (ended, errs[0][-3000:])


def test_a_hang_across_two_nodes_is_named_on_node_0_and_ends_both(tmp_path: Path) -> None:
    """Rank 1 (node 1) stays alive but never enters the second all_reduce; rank 0 (node 0) waits in its kernel.
    Node 0's `ddpboot stacks` names that wait and the collective on its line, node 0 ends at its stall timeout with
    the stack in its run directory and a verdict, and node 1 ends with it. NCCL's flight recorder writes its dump
    when a collective times out or fails, and here none does before the stall timeout: the flight recorder test
    below covers the dump."""
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    # No py-spy needed: every Python rank registers faulthandler before the script's first line (the bootstrap).
    launchers, envs = _two_nodes(tmp_path, HANG_ON_NODE_1, (STALL, "600"))  # node 0's stall timeout ends the job
    waiting = ("synchronize (waiting for the GPU), called from hang.py:11 in <module>, after all_reduce on that line")
    try:
        run = _past_first_all_reduce(tmp_path)
        hung_at = time.monotonic()
        got = wait_for(partial(_summaries, run, envs[0], (0, (waiting,))), 60,
                       f"node 0's on-demand summary naming {waiting!r}", interval=1.0)
        assert list(got) == [0], got
    finally:
        codes = _end(launchers, float(STALL) * 3 + 60)
    ended = time.monotonic() - hung_at
    errs = [(tmp_path / f"stderr{n}").read_text() for n in (0, 1)]
    assert codes[0] != 0 and ended < float(STALL) * 3, (codes, ended)
    _check_stalled(errs[0], tmp_path / "logs0", {0: (waiting,)})
    verdicts = [line for line in errs[0].splitlines() if line.startswith("ddpboot: verdict:")]
    assert verdicts, errs[0][-3000:]
    assert codes[1] != 0 and "the job failed on node 0" in errs[1], (codes, errs[1][-3000:])
    if os.environ.get("OUT"):  # the device machine's output folder: keep what node 0 said
        Path(os.environ["OUT"], "hang-two-nodes.log").write_text(errs[0][-20000:])
    assert "is deprecated" not in errs[0], [line for line in errs[0].splitlines() if "is deprecated" in line]


BEHIND = """
import datetime, os, time
rank = int(os.environ["RANK"])
os.environ["CUDA_VISIBLE_DEVICES"] = "0"  # the launcher's --cpu hid the GPUs: both ranks share GPU 0
os.environ["NCCL_HOSTID"] = f"ddpboot-test-host-{rank}"  # two hosts to NCCL, which refuses two ranks on one GPU
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0), timeout=datetime.timedelta(seconds=15))
t = torch.ones(1, device="cuda")
dist.all_reduce(t); dist.all_reduce(t)
dist.broadcast(t, 0); torch.cuda.synchronize()
print(f"rank {rank}: ready", flush=True)
if rank == 1:
    time.sleep(300)  # rank 1 never calls the all_reduce below
dist.all_reduce(t); torch.cuda.synchronize()
"""


def test_an_nccl_timeout_s_flight_recorder_dumps_name_the_rank_behind(tmp_path: Path) -> None:
    """Rank 1 skips the last all_reduce; rank 0's NCCL watchdog times out after 15 s and, with the flight recorder
    the launcher sets up under --log-dir (TORCH_NCCL_DUMP_ON_TIMEOUT), dumps its collectives and signals rank 1
    through the store to dump its own. Rank 0 aborts, the job ends, and the failure report's verdict names rank 1
    as behind: its last collective, the broadcast, has the number before rank 0's all_reduce. One launcher, its two
    ranks on GPU 0 as two hosts (a distinct NCCL_HOSTID each, set by the script; NCCL's sockets on lo), so that
    both dumps are in its attempt directory."""
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    job = tmp_path / "behind.py"
    job.write_text(BEHIND)
    logs = tmp_path / "logs"
    env = clean_env(NCCL_NVLS_ENABLE="0", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_P2P_DISABLE="1",
                    NCCL_SHM_DISABLE="1")
    out = subprocess.run([*ddpboot_exe(), "--cpu", "--nproc", "2", "--gpu-watch", "off", "--log-dir", str(logs),
                          "--shutdown-timeout", "5", str(job)], env=env, capture_output=True, text=True, timeout=400,
                         cwd=REPO)
    if os.environ.get("OUT"):  # the device machine's output folder: keep what the launcher said
        Path(os.environ["OUT"], "flight-behind.log").write_text(out.stderr[-20000:])
    assert out.returncode != 0 and "ddpboot: rank 0 failed" in out.stderr, out.stderr[-4000:]
    assert sorted(p.name for p in logs.glob("*/attempt_0/nccl_trace_rank_*")) == ["nccl_trace_rank_0",
                                                                                  "nccl_trace_rank_1"]
    verdict = [line for line in out.stderr.splitlines() if line.startswith("ddpboot: verdict: flight recorder: ")]
    assert verdict, out.stderr[-4000:]
    m = re.fullmatch(r"ddpboot: verdict: flight recorder: rank 1 is behind in process group 0 \(default_pg\): its "
                     r"last collective is broadcast #(\d+) at behind\.py:11 \(completed\); rank 0 is at all_reduce "
                     r"#(\d+) at behind\.py:15 \(not completed\); rank 1 never called all_reduce #(\d+): "
                     r"look at rank 1", verdict[-1])
    assert m is not None, verdict[-1]
    assert int(m[2]) == int(m[3]) == int(m[1]) + 1, verdict[-1]
