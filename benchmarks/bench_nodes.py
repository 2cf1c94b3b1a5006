"""Many nodes on one machine: N launchers of one rank each, ddpboot against torchrun, static and through c10d.

    python3 benchmarks/bench_nodes.py --nodes 16,32,64 --rounds 1 --out DIR

For each node count and round, four jobs run one after the other (the order rotates by round), each made of N
launchers started together on this machine, each with one CPU rank (gloo) running a tiny job: note the time,
import torch, init_process_group, one all_reduce of the rank numbers (checked), exit.

- `static`:  `--nnodes N --node-rank i --master-addr 127.0.0.1 --master-port P`;
- `c10d`:    `--nnodes N:N --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:P --rdzv-id ID` (torchrun's `--nnodes N`
  with c10d is the same N:N range), with the same flags for both launchers (ddpboot: `--cpu`, torchrun:
  `--nproc-per-node 1`; both otherwise at their defaults).

Measured per job, from the instant the N launchers are started: launch → every launcher exited (and their exit
codes); launch → the last rank's first line (what the launchers spend before any rank runs: ddpboot's node check,
torchrun's rendezvous, both launchers' start); a rank's first line → its process group ready (import torch and
init_process_group: the store traffic and gloo's connections, slowest rank) and launch → the last
all_reduce done. The launcher side's peak RSS per node (the launcher and its helper processes, ranks left out;
VmRSS polled every 0.1 s), summed over the nodes, is the memory that grows with the nodes. A job
that does not finish within --timeout is killed and reported with the first failing launcher's last lines
(what fails first). Nothing is asserted on the times; a Markdown table goes to stdout; --out keeps every
launcher's output; the exit status is 1 when any job did not exit 0 everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
DDPBOOT = [str(Path(PY).with_name("ddpboot"))] if Path(PY).with_name("ddpboot").exists() else [PY, "-m", "ddpboot"]
TORCHRUN = [PY, "-m", "torch.distributed.run"]

RANK = """
import os, sys, time
started = time.time()
import torch, torch.distributed as dist
dist.init_process_group("gloo")
inited = time.time()
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
w = dist.get_world_size()
assert t.item() == w * (w - 1) / 2, t
done = time.time()
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(f"{started} {inited} {done}")
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    drop = ("PET_", "DDPBOOT_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env["DDPBOOT_LOCK_DIR"] = tempfile.mkdtemp(prefix="bench-locks-")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def command(launcher: str, mode: str, nodes: int, node: int, port: int, script: str, out: str) -> list[str]:
    base = [*DDPBOOT, "--cpu"] if launcher == "ddpboot" else [*TORCHRUN, "--nproc-per-node", "1"]
    if mode == "static":
        flags = ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
                 str(port)]
    else:
        flags = ["--nnodes", f"{nodes}:{nodes}", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-id", f"bench-{port}"]
    return [*base, *flags, script, out]


def vm_rss(pid: int) -> int:
    with contextlib.suppress(OSError, StopIteration, ValueError), open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024
    return 0


def launcher_rss(pid: int, script: str) -> int:
    """RSS of a launcher and every process under it that is not a rank (ddpboot's guardian and c10d agent,
    torchrun's store threads live in its own process): what the launcher side costs per node."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            if p == pid or script not in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"):
                total += vm_rss(p)
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
    return total


def one_job(launcher: str, mode: str, nodes: int, script: str, timeout: float, keep: Path | None) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"bench-nodes-{launcher}-{mode}-{nodes}-"))
    logs = keep / f"{launcher}-{mode}-{nodes}-{int(time.time())}" if keep else out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port, env = free_port(), clean_env()
    start = time.time()
    procs = []
    for node in range(nodes):
        with open(logs / f"node{node}.log", "w") as log:
            procs.append(subprocess.Popen(command(launcher, mode, nodes, node, port, script, str(out)), env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    peak: dict[int, int] = {}
    ended: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(ended) < nodes and time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if i not in ended:
                peak[i] = max(peak.get(i, 0), launcher_rss(proc.pid, script))
                if proc.poll() is not None:
                    ended[i] = time.time()
        time.sleep(0.1)
    for i, proc in enumerate(procs):
        if i not in ended:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    codes = [p.returncode for p in procs]
    marks = [tuple(float(x) for x in f.read_text().split()) for f in out.glob("rank*")]
    # the first launcher that failed by itself, else the first one killed at the deadline
    failing = next((i for i, c in enumerate(codes) if c not in (0, -signal.SIGKILL)), None)
    failing = next((i for i, c in enumerate(codes) if c != 0), None) if failing is None else failing
    first_failure = ""
    if failing is not None:
        lines = (logs / f"node{failing}.log").read_text(errors="replace").strip().splitlines()
        first_failure = f"node {failing} exit {codes[failing]}: " + " / ".join(lines[-3:])[-400:]
    return {
        "exit": max(ended.values()) - start if len(ended) == nodes else float("nan"),
        "ok": sum(1 for c in codes if c == 0),
        "first_rank": max(m[0] for m in marks) - start if len(marks) == nodes else float("nan"),
        "init": max(m[1] - m[0] for m in marks) if len(marks) == nodes else float("nan"),
        "allreduce": max(m[2] for m in marks) - start if len(marks) == nodes else float("nan"),
        "rss": sum(peak.values()),
        "failure": first_failure,
    }


def seconds(values: list[float]) -> str:
    good = [v for v in values if v == v]
    if not good:
        return "—"
    text = f"{statistics.median(good):.1f} s"
    return text + (f" ({min(good):.1f}–{max(good):.1f})" if len(good) > 1 else "")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal")) / 1024**2
    import importlib.metadata

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    return (f"{model}, {len(os.sched_getaffinity(0))} cores usable, {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"Python {platform.python_version()}, torch {importlib.metadata.version('torch')}, ddpboot commit {commit}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="16,32,64", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="static,c10d")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one job may take")
    parser.add_argument("--out", type=Path, help="keep every launcher's output here")
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp(prefix="bench-nodes-")) / "rank.py"
    script.write_text(RANK)
    cases = [(launcher, mode) for mode in args.modes.split(",") for launcher in ("ddpboot", "torchrun")]
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        got: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cases}
        for n in range(args.rounds):
            for case in cases[n % len(cases):] + cases[: n % len(cases)]:
                result = one_job(*case, nodes, str(script), args.timeout, args.out)
                print(f"{nodes} nodes, round {n}, {case}: {result}", file=sys.stderr, flush=True)
                got[case].append(result)
        rows.append((nodes, got))
    print(f"Machine: {machine()}\n")
    print(f"`python3 benchmarks/bench_nodes.py --nodes {args.nodes} --rounds {args.rounds} --modes {args.modes}`; "
          f"median (min–max) of {args.rounds} round(s), seconds from the start of the N launchers\n")
    print("| nodes | mode | launcher | launch → all exited | launch → last rank's first line | rank: first line → "
          "group ready, slowest | launch → last all_reduce | launcher side's peak RSS, sum | exit 0 | first failure |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for nodes, got in rows:
        for (launcher, mode), results in got.items():
            rss = statistics.median(r["rss"] for r in results) / 2**20
            failure = next((r["failure"] for r in results if r["failure"]), "").replace("|", "/")
            print(f"| {nodes} | {mode} | {launcher} | {seconds([r['exit'] for r in results])} | "
                  f"{seconds([r['first_rank'] for r in results])} | {seconds([r['init'] for r in results])} | "
                  f"{seconds([r['allreduce'] for r in results])} | {rss:,.0f} MiB | "
                  f"{min(r['ok'] for r in results)}/{nodes} | {failure} |")
    failed = [f"{nodes} nodes {mode} {launcher}" for nodes, got in rows for (launcher, mode), results in got.items()
              if any(r["ok"] < nodes for r in results)]
    if failed:
        sys.exit(f"bench_nodes: jobs that did not all exit 0: {', '.join(failed)} (see the table's last column)")


if __name__ == "__main__":
    main()
