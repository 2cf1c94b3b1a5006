"""Warm launches against fast start, exec and torchrun, on the same job, in alternating runs.

    .venv/bin/python benchmarks/bench_warm.py [--nproc 2] [--pairs 5] [--backend gloo|nccl] [--two-nodes]
                                              [--append benchmarks/RESULTS.md]

The job: init_process_group, one all_reduce, destroy_process_group (gloo on CPU; `--backend nccl`: on GPU 0, the
rank calling set_device first). Measured: launch → exit as the caller sees it, per mode, medians with min–max and the
ratio to torchrun. `--two-nodes`: the job as two one-rank nodes on this machine (two launchers, `--nnodes 2`, each
rank on GPU 0 with its own NCCL_HOSTID and NCCL's socket transport on loopback, as two one-GPU machines run it);
the time is until both launchers have exited.

`ddpboot --warm` runs repeated launches: one untimed warm launch first starts the warm process (its time is
reported apart, as "first warm launch"); every timed one finds it running. The warm process lives in a temporary
directory of its own (DDPBOOT_WARM_DIR) and is stopped at the end. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent

JOB = """
import os, torch, torch.distributed as dist
nccl = os.environ.get("BENCH_BACKEND") == "nccl"
if nccl:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl" if nccl else "gloo")
t = torch.ones(4, device="cuda" if nccl else "cpu") * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t[0].item() == sum(range(1, dist.get_world_size() + 1))
dist.destroy_process_group()
"""

TWO_NODES = {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1",
             "NCCL_SHM_DISABLE": "1"}


def ddpboot() -> list[str]:
    script = Path(PY).with_name("ddpboot")
    return [str(script)] if script.exists() else [PY, "-m", "ddpboot"]


def clean_env(warm_dir: str, backend: str) -> dict[str, str]:
    drop = ("PET_", "DDPBOOT_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        env.pop(k, None)
    env.update(DDPBOOT_LOCK_DIR=tempfile.mkdtemp(prefix="bench-locks-"), DDPBOOT_WARM_DIR=warm_dir,
               BENCH_BACKEND=backend)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commands(mode: str, nproc: int, backend: str, two_nodes: bool) -> list[list[str]]:
    """One command per launcher."""
    flags = {"ddpboot --warm": ["--warm"], "ddpboot --fast-start": ["--fast-start"], "ddpboot": []}
    gpu = ["--gpus", "0", "--share"] if backend == "nccl" and two_nodes else []
    if not two_nodes:
        if mode == "torchrun":
            return [[PY, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]]
        cpu = ["--cpu"] if backend == "gloo" else []
        return [[*ddpboot(), "--nproc", str(nproc), *cpu, *flags[mode]]]
    port = str(free_port())
    out = []
    for node in (0, 1):
        if mode == "torchrun":
            out.append([PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                        "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1"])
        else:
            out.append([*ddpboot(), "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                        "--master-port", port, "--nproc", "1", *gpu, *flags[mode]])
    return out


def run_once(cmds: Sequence[Sequence[str]], job: Path, env: dict[str, str], two_nodes: bool) -> float:
    start = time.monotonic()
    procs = []
    for node, cmd in enumerate(cmds):
        e = dict(env, NCCL_HOSTID=f"bench-node-{node}", **TWO_NODES) if two_nodes else env
        procs.append(subprocess.Popen([*cmd, str(job)], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    errs = [p.communicate(timeout=600)[1] for p in procs]
    took = time.monotonic() - start
    for p, err in zip(procs, errs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"{cmds} failed ({p.returncode}):\n{err.decode()[-3000:]}")
    return took


def stats(xs: Sequence[float]) -> str:
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f} s–{max(xs):.2f} s)"


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    import torch

    gpu = ""
    if torch.cuda.is_available():
        gpu = f", GPU: {torch.cuda.get_device_name(0)} ×{torch.cuda.device_count()}, CUDA {torch.version.cuda}"
    return (f"{model}, {len(os.sched_getaffinity(0))} cores usable, Linux {platform.release()}, Python "
            f"{platform.python_version()}, torch {torch.__version__}{gpu}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5, help="timed runs per mode")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--two-nodes", action="store_true", help="two one-rank nodes on this machine (see the docstring)")
    ap.add_argument("--append", type=Path, help="append the table to this file (RESULTS.md)")
    a = ap.parse_args()
    modes = ["ddpboot --warm", "ddpboot --fast-start", "ddpboot", "torchrun"]
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        warm_dir = os.path.join(tmp, "warm")
        env = clean_env(warm_dir, a.backend)
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        try:
            first = run_once(commands("ddpboot --warm", a.nproc, a.backend, a.two_nodes), job, env, a.two_nodes)
            times: dict[str, list[float]] = {m: [] for m in modes}
            for i in range(a.pairs):
                for mode in modes[i % len(modes):] + modes[: i % len(modes)]:  # rotated each round
                    times[mode].append(run_once(commands(mode, a.nproc, a.backend, a.two_nodes), job, env,
                                                a.two_nodes))
        finally:
            subprocess.run([*ddpboot(), "warm", "stop"], env=env, capture_output=True, timeout=60)
    layout = "2 one-rank nodes on one machine" if a.two_nodes else f"{a.nproc} rank{'s' if a.nproc > 1 else ''}"
    torchrun = statistics.median(times["torchrun"])
    lines = [
        "",
        f"### Warm launches: {layout}, {a.backend} init + all_reduce + destroy, launch → exit "
        f"({time.strftime('%Y-%m-%d')})",
        "",
        f"`{' '.join(['python', 'benchmarks/bench_warm.py', *sys.argv[1:]])}`; {a.pairs} runs per mode, rotated. "
        f"Machine: {machine()}.",
        "",
        "| mode | launch → exit | ÷ torchrun |",
        "|---|---|---|",
        *(f"| {m} | {stats(times[m])} | {statistics.median(times[m]) / torchrun:.2f}× |" for m in modes),
        f"| first warm launch (starts the warm process) | {first:.2f} s | {first / torchrun:.2f}× |",
        "",
    ]
    print("\n".join(lines))
    if a.append:
        with a.append.open("a") as f:
            f.write("\n".join(lines))


if __name__ == "__main__":
    main()
