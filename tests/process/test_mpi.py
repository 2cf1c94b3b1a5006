"""Real MPI jobs on this machine, under Open MPI's mpirun and MPICH's Hydra mpiexec, in both patterns:

- one rank per MPI process: `mpirun -np 2 python rank.py`, whose `ddpboot.init()` reads the MPI launcher's
  variables (ddpboot/cluster/mpi.py: store on loopback, since every rank is on this host; the port from Open
  MPI's job id, or from the pid of Hydra's proxy, which started both ranks);
- one ddpboot launcher per "node": `mpirun -np 2 ddpboot --cpu --nproc 1 rank.py`, two launchers on this one host,
  each a node of its own (node rank = its MPI rank; ddpboot/nodes/static.py), one CPU rank each, gloo;
- two hosts that really differ, under Hydra: its proxies started through `-bootstrap-exec` with a wrapper that
  gives each its own UTS namespace and host name (hostA, hostB), so that a hostfile's placement is real: round-robin
  (a hostfile without `:N`) and uneven (2 + 1) ranks get their node from where they run (cluster/placement.py), and
  a failing rank on one "host" ends the launcher on the other (the node link, nodes/link.py);
- the MPI launcher's own failures: `kill -9` of mpirun ends the launchers it started, `--nnodes 1` under mpirun is
  refused, and a core binding narrower than the ranks is widened.

The tests skip, saying so, where the MPI launchers are missing (`scripts/ci/mpi-up` installs Debian's openmpi-bin
and mpich as root; `make test` runs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import SCRIPTS, free_port, gone, wait_for

REPO = Path(__file__).resolve().parents[2]
DDPBOOT = Path(sys.executable).with_name("ddpboot")
TIMEOUT = 120

MPIRUNS = {
    # Open MPI refuses root without both variables, and 2 processes on fewer cores without --oversubscribe
    "openmpi": ["mpirun.openmpi", "--oversubscribe", "-np", "2"],
    "mpich": ["mpiexec.hydra", "-np", "2"],
}

RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys, warnings
    import torch
    import torch.distributed as dist
    import ddpboot

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", ddpboot.DdpbootWarning)
        ctx = ddpboot.init()
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    report = {"rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
              "local_world_size": ctx.local_world_size, "node_rank": ctx.node_rank, "launcher": ctx.launcher,
              "backend": ctx.backend, "sum": total.item(), "master_port": os.environ.get("MASTER_PORT"),
              "warnings": [str(w.message) for w in got if issubclass(w.category, ddpboot.DdpbootWarning)]}
    with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as f:
        json.dump(report, f)
''')


def mpirun(flavour: str) -> list[str]:
    cmd = MPIRUNS[flavour]
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not on PATH (apt-get install openmpi-bin mpich, or run scripts/ci/mpi-up as root)")
    return cmd


def env() -> dict[str, str]:
    """This environment without any launcher's variables, MPI's included (the suite may itself run under one)."""
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_", "OMPI_", "PMI", "MPI_", "MV2_",
                                 "PALS_", "JSM_", "PBS_", "LSB_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    kept.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [kept.get("PYTHONPATH")])]),
                OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return kept


def run(cmd: list[str], tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([*cmd, str(script), str(out)], env=env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reps = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return reps, proc.stdout + proc.stderr


@pytest.mark.parametrize("flavour", sorted(MPIRUNS))
def test_mpirun_starts_the_ranks(flavour: str, tmp_path: Path) -> None:
    reps, _ = run([*mpirun(flavour), sys.executable], tmp_path)
    for rank, r in enumerate(reps):
        assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node_rank"]) == (
            rank, 2, rank, 2, 0)
        assert (r["launcher"], r["backend"], r["sum"], r["warnings"]) == ("mpi", "gloo", 3.0, [])
    assert reps[0]["master_port"] == reps[1]["master_port"] is not None  # both derived the same port


@pytest.mark.parametrize("flavour", sorted(MPIRUNS))
def test_mpirun_starts_one_launcher_per_node(flavour: str, tmp_path: Path) -> None:
    reps, output = run([*mpirun(flavour), str(DDPBOOT), "--cpu", "--nproc", "1"], tmp_path)
    for rank, r in enumerate(reps):
        assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node_rank"]) == (
            rank, 2, 0, 1, rank)
        assert (r["launcher"], r["backend"], r["sum"], r["warnings"]) == ("ddpboot", "gloo", 3.0, [])
    assert output.count("MPI started 2 ddpboot launchers on this host") == 2


# --- two hosts under Hydra -------------------------------------------------------------------------------------

WRAPPER = """#!/bin/sh
# Hydra's ssh launcher runs `ssh -x HOST COMMAND`: run COMMAND here instead, in a UTS namespace named HOST.
[ "$1" = "-x" ] && shift
host=$1; shift
exec unshare --uts sh -c 'hostname "$0"; exec sh -c "$*"' "$host" "$@"
"""


def hydra_hosts(tmp_path: Path, hosts: str) -> list[str]:
    """mpiexec.hydra over two "hosts" (hostfile `hosts`), each proxy in a UTS namespace of that name."""
    cmd = mpirun("mpich")[0]
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--uts", "true"], check=False).returncode:
        pytest.skip("unshare --uts is not available here (util-linux, and CAP_SYS_ADMIN)")
    wrapper = tmp_path / "uts-ssh"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hosts)
    return [cmd, "-bootstrap", "ssh", "-bootstrap-exec", str(wrapper), "-f", str(hostfile)]


def across_hosts(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The ranks are on two hosts, so nothing defaults the store to loopback: MASTER_ADDR names rank 0's."""
    return {**env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
            "NODES_OUT": str(tmp_path), **extra}


@pytest.mark.parametrize(("hosts", "ranks", "expected"), [
    ("hostA\nhostB\n", 4, {0: ("hostA", 0, 0), 1: ("hostB", 1, 0), 2: ("hostA", 0, 1), 3: ("hostB", 1, 1)}),
    ("hostA:2\nhostB:1\n", 3, {0: ("hostA", 0, 0), 1: ("hostA", 0, 1), 2: ("hostB", 1, 0)}),
], ids=["round-robin", "uneven"])
def test_node_ranks_follow_the_hosts_under_any_placement(hosts: str, ranks: int, expected: dict[int, tuple[str, int,
                                                                                                          int]],
                                                          tmp_path: Path) -> None:
    """GROUP_RANK, GROUP_WORLD_SIZE and ctx.node_rank from where each rank runs, not from rank // local size."""
    cmd = [*hydra_hosts(tmp_path, hosts), "-n", str(ranks), sys.executable, str(SCRIPTS / "nodes_job.py")]
    proc = subprocess.run(cmd, env=across_hosts(tmp_path), capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reps = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)}
    for rank, (host, node, local) in expected.items():
        r = reps[rank]
        assert (r["host"], r["node_rank"], r["local_rank"]) == (host, node, local), (rank, r)
        assert (r["group_rank"], r["group_world_size"]) == (str(node), "2"), (rank, r)
        assert r["sum"] == float(ranks) and r["launcher"] == "mpi"


def test_a_failure_on_one_host_ends_the_launcher_on_the_other(tmp_path: Path) -> None:
    """Hydra does not end the other processes when one exits non-zero: the launcher on hostA stops its sleeping
    rank because the launcher on hostB says, through the store, that its rank 1 exited 3."""
    cmd = [*hydra_hosts(tmp_path, "hostA\nhostB\n"), "-n", "2", str(DDPBOOT), "--cpu", "--nproc", "1",
           str(SCRIPTS / "nodes_job.py")]
    started = time.time()
    proc = subprocess.run(cmd, env=across_hosts(tmp_path, NODES_FAIL_RANK="1", NODES_SLEEP="60"),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    took = time.time() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and took < 45, (took, output)
    assert "the job failed on node 1 (hostB): rank 1 exit code 3" in output, output
    reps = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)}
    assert [reps[r]["host"] for r in range(2)] == ["hostA", "hostB"]


def test_kill_9_of_mpirun_ends_the_launchers_it_started(tmp_path: Path) -> None:
    """Open MPI's mpirun killed: its launchers' MPI parent is gone, so each stops its ranks and ends."""
    cmd = [*mpirun("openmpi"), str(DDPBOOT), "--cpu", "--nproc", "1", str(SCRIPTS / "nodes_job.py")]
    proc = subprocess.Popen(cmd, env={**env(), "NODES_OUT": str(tmp_path), "NODES_SLEEP": "60"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def rank_pids() -> list[int] | None:
        found = sorted(tmp_path.glob("rank*.json"))
        return [json.loads(p.read_text())["pid"] for p in found] if len(found) == 2 else None

    try:
        ranks = wait_for(rank_pids, TIMEOUT, "both ranks to start")
        launchers = [c.pid for c in psutil.Process(proc.pid).children() if "ddpboot" in " ".join(c.cmdline())]
        assert len(launchers) == 2, launchers
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.time()
        for pid in [*ranks, *launchers]:
            wait_for(lambda pid=pid: gone(pid), 15, f"pid {pid} to end")
        print(f"ranks and launchers gone {time.time() - killed:.2f} s after kill -9 of mpirun")
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_nnodes_1_under_mpirun_is_refused(tmp_path: Path) -> None:
    """`mpirun -np 2 ddpboot --nnodes 1 ...` would run two separate jobs: refused, as --standalone is."""
    proc = subprocess.run([*mpirun("openmpi"), str(DDPBOOT), "--nnodes", "1", "--cpu", "--nproc", "1", "x.py"],
                          env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("ddpboot: error: --nnodes 1, but MPI started 2 ddpboot launchers: each would run a job of "
                             "its own. Drop --nnodes") == 2, proc.stderr


def test_a_core_binding_narrower_than_the_ranks_is_widened() -> None:
    """Open MPI binds a process of `mpirun -np 1` to one core: the launcher's two ranks get a core each."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    proc = subprocess.run([*mpirun("openmpi")[:-1], "1", str(DDPBOOT), "plan", "--cpu", "--nproc", "2", "--json"],
                          env=env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    cores = [tuple(r["cpus"]) for r in plan["ranks"]]
    assert len(set(cores)) == 2, cores
    assert any("the MPI launcher bound this ddpboot (Open MPI) to CPU" in n and "--bind-to none" in n
               for n in plan["notes"]), plan["notes"]
