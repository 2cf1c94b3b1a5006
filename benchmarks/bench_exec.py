"""A 1-rank job under `ddpboot` (exec'd rank) against the same worker started by hand with the same variables, in
alternating runs, and a waterfall of what the launcher adds before the rank starts and after it exits.

    PYTHONPATH=. python3 benchmarks/bench_exec.py [--repeat 10] [--backend gloo|nccl]

The job (init_process_group, one all_reduce, destroy; nccl: on GPU 0, set_device first) writes the time of its first
line and of its last into a file. The bare worker gets the variables ddpboot gives the rank (`--dry-run --json`:
RANK, WORLD_SIZE, MASTER_ADDR, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, ...) with a free MASTER_PORT, and none of the
launcher's own (its store and run directory). Printed: launch → exit medians (min–max) and the ratio ddpboot/bare;
then, from runs of the launcher with its steps timed (the launcher runs inside a small wrapper that wraps its
functions and records when each one starts and ends: interpreter start, imports and option parsing, the
configuration, the inventory (NVML), the plan (CPU affinity), the store's socket, the run directory and the
supervisor's imports, the guardian, the rank's start, the GPU watch's first look, the rank's own run, the leftover
search, teardown), the waterfall: each step's median duration, and the rank's own time against the bare worker's.
Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

JOB = """
import time
first = time.time()
import json, os, sys
import torch
import torch.distributed as dist
nccl = os.environ.get("BENCH_BACKEND") == "nccl"
if nccl:
    torch.cuda.set_device(0)
dist.init_process_group("nccl" if nccl else "gloo")
t = torch.ones(4, device="cuda" if nccl else "cpu")
dist.all_reduce(t)
assert t[0].item() == 1
dist.destroy_process_group()
with open(os.environ["BENCH_MARKS"], "w") as f:
    json.dump({"first": first, "last": time.time()}, f)
"""

# The wrapper the timed launcher runs in: it wraps the launcher's steps and writes when each began and ended.
WRAPPER = """
import time
T = {"python": time.time()}
import functools, json, os, sys
sys.argv = ["ddpboot", *sys.argv[1:]]
STEPS = json.loads(os.environ["BENCH_STEPS"])
import importlib

def wrap(owner, name, step):
    fn = getattr(owner, name)
    @functools.wraps(fn)
    def timed(*a, **k):
        T.setdefault(step + ":start", time.time())
        try:
            return fn(*a, **k)
        finally:
            T.setdefault(step + ":end", time.time())
    setattr(owner, name, timed)

def install():
    for line in STEPS:
        where, step = line.split()
        module, _, path = where.partition(":")
        *owner, name = path.split(".")
        obj = importlib.import_module(module)
        for part in owner:
            obj = getattr(obj, part)
        wrap(obj, name, step)

import ddpboot.cli.run as _run_module  # the run path's modules: what the launcher imports before parsing
T["imported"] = time.time()
install()
T["wrapped"] = time.time()
def record():
    T["exit"] = time.time()
    with open(os.environ["BENCH_TIMES"], "w") as f:
        json.dump(T, f)

_exit = os._exit
def timed_exit(code):
    record()
    _exit(code)
os._exit = timed_exit
try:
    from ddpboot.cli.app import main
    main()
except SystemExit:
    record()
    raise
"""

# "module:function step" or "module:Class.method step": looked up where the launcher calls them, so wrapped there.
STEPS = """
ddpboot.launch.config:build config
ddpboot.launch.runner:run runner
ddpboot.launch.runner:load_inventory inventory
ddpboot.launch.runner:make_plan plan
ddpboot.launch.runner:bind_node_store store
ddpboot.launch.supervisor:Supervisor.run supervisor
ddpboot.launch.supervisor:start_guardian guardian
ddpboot.launch.supervisor.loop:ProcessTable.start spawn
ddpboot.launch.supervisor.loop:AttemptLoop.run attempt
ddpboot.launch.observe.gpuwatch:GpuWatch.check gpuwatch
ddpboot.launch.supervisor:Supervisor._end_leftovers leftovers
ddpboot.launch.supervisor:Supervisor._finish finish
""".strip().splitlines()

# (what, from, to): the waterfall's rows, each the time between two marks.
WATERFALL = [
    ("interpreter start", "launch", "python"),
    ("imports (typer, rich's absence, the run path)", "python", "imported"),
    ("option parsing (typer, click)", "wrapped", "config:start"),
    ("the configuration (launch/config.py build)", "config:start", "config:end"),
    ("runner: notes, signals blocked", "runner:start", "inventory:start"),
    ("inventory (NVML)", "inventory:start", "inventory:end"),
    ("plan (CPU affinity)", "plan:start", "plan:end"),
    ("locks, capacity checks", "plan:end", "store:start"),
    ("the store's socket", "store:start", "store:end"),
    ("run directory, supervisor's imports", "store:end", "supervisor:start"),
    ("guardian (store server, orphan killer)", "guardian:start", "guardian:end"),
    ("starter, signalfd, own children", "guardian:end", "spawn:start"),
    ("the rank's fork + exec", "spawn:start", "spawn:end"),
    ("rank: exec → its first line", "spawn:end", "first"),
    ("rank: first line → last line (torch, init, all_reduce, destroy)", "first", "last"),
    ("rank: last line → reaped by the launcher", "last", "attempt:end"),
    ("leftover search", "leftovers:start", "leftovers:end"),
    ("teardown (status, guardian, temporary directory)", "attempt:end", "supervisor:end"),
    ("runner's teardown (locks, socket)", "supervisor:end", "exit"),
    ("launcher's exit (the interpreter's finalization)", "exit", "end"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(backend: str) -> dict[str, str]:
    drop = ("PET_", "DDPBOOT_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(DDPBOOT_LOCK_DIR=tempfile.mkdtemp(prefix="bench-locks-"), NCCL_NVLS_ENABLE="0", BENCH_BACKEND=backend)
    return env


def ddpboot_cmd(job: Path, backend: str) -> list[str]:
    return [PY, "-m", "ddpboot", "--nproc", "1", *([] if backend == "nccl" else ["--cpu"]), str(job)]


def bare_env(job: Path, env: dict[str, str], backend: str) -> dict[str, str]:
    """The rank's variables from the dry run, without the launcher's store and run directory."""
    out = subprocess.run([*ddpboot_cmd(job, backend)[:3], "--dry-run", "--json", *ddpboot_cmd(job, backend)[3:]],
                         env=env, capture_output=True, text=True, check=True)
    given = json.loads(out.stdout)["workers"][0]["env"]
    launcher_own = ("TORCHELASTIC_", "DDPBOOT_")
    return {**env, **{k: v for k, v in given.items() if not k.startswith(launcher_own)}}


def one(argv: list[str], env: dict[str, str], marks: Path) -> dict[str, float]:
    env = {**env, "BENCH_MARKS": str(marks)}
    if "MASTER_PORT" in env:
        env["MASTER_PORT"] = str(free_port())
    launch, cpu = time.time(), _cpu()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=env.get("BENCH_CWD"))
    end = time.time()
    if out.returncode != 0:
        raise RuntimeError(f"{argv}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return {"launch": launch, "end": end, "cpu": _cpu() - cpu, **json.loads(marks.read_text())}


def _cpu() -> float:
    """CPU seconds of every finished child (the launcher, its guardian and the rank): what the job cost, however
    busy the machine is."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _med(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.0f} ms ({min(values) * 1e3:.0f}–{max(values) * 1e3:.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10, help="alternating rounds (after one warm-up round)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--baseline", type=Path, help="another checkout of ddpboot, its launch measured alongside")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-exec-") as tmp:
        work = Path(tmp)
        job, wrapper = work / "job.py", work / "wrapper.py"
        job.write_text(JOB)
        wrapper.write_text(WRAPPER)
        env = base_env(args.backend)
        bare = bare_env(job, env, args.backend)
        timed = {**env, "BENCH_STEPS": json.dumps(STEPS), "BENCH_TIMES": str(work / "times.json")}
        contenders = {
            "bare worker": ([PY, "-u", str(job)], bare),
            "ddpboot --nproc 1": (ddpboot_cmd(job, args.backend), env),
            "ddpboot, steps timed": ([PY, str(wrapper), *ddpboot_cmd(job, args.backend)[3:]], timed),
        }
        if args.baseline is not None:  # `python -m` looks in the working directory first: the run starts in it
            other = {**env, "PYTHONPATH": os.pathsep.join([str(args.baseline.resolve()), env["PYTHONPATH"]]),
                     "BENCH_CWD": str(args.baseline.resolve())}
            contenders["baseline: ddpboot --nproc 1"] = (ddpboot_cmd(job, args.backend), other)
        print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, load "
              f"{os.getloadavg()[0]:.1f}; backend {args.backend}; {args.repeat} alternating rounds after a warm-up",
              flush=True)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        order = list(contenders)
        for r in range(args.repeat + 1):
            for name in order[r % len(order):] + order[: r % len(order)]:
                argv, e = contenders[name]
                got = one(argv, e, work / "marks.json")
                if name == "ddpboot, steps timed":
                    got.update(json.loads((work / "times.json").read_text()))
                if r:
                    runs[name].append(got)
    walls = {name: [m["end"] - m["launch"] for m in got] for name, got in runs.items()}
    floor = statistics.median(walls["bare worker"])
    cpus = {name: [m["cpu"] for m in got] for name, got in runs.items()}
    cpu_floor = statistics.median(cpus["bare worker"])
    print("\n| launch → exit | wall, median (min–max) | / bare worker | CPU of all its processes | / bare worker |")
    print("|---|---|---|---|---|")
    for name, w in walls.items():
        print(f"| {name} | {_med(w)} | {statistics.median(w) / floor:.2f}x | {_med(cpus[name])} | "
              f"{statistics.median(cpus[name]) / cpu_floor:.2f}x |")
    print("\nThe waterfall (the steps-timed runs; median of each step; a step the job does not take is left out):\n")
    print("| step | median | min–max |\n|---|---|---|")
    steps = runs["ddpboot, steps timed"]
    for what, a, b in WATERFALL:
        got = [m[b] - m[a] for m in steps if a in m and b in m]
        if got:
            print(f"| {what} | {statistics.median(got) * 1e3:.1f} ms | {min(got) * 1e3:.1f}–{max(got) * 1e3:.1f} |")
    first = [m["gpuwatch:end"] - m["gpuwatch:start"] for m in steps if "gpuwatch:end" in m]
    print(f"| the GPU watch's first look | {statistics.median(first) * 1e3:.1f} ms | |" if first else
          "| the GPU watch's first look | (not taken: no GPU in the plan, or the job ended before it) | |")
    bare_runs = runs["bare worker"]
    before_bare = statistics.median(m["first"] - m["launch"] for m in bare_runs)
    after_bare = statistics.median(m["end"] - m["last"] for m in bare_runs)
    for name in [n for n in runs if n != "bare worker"]:
        before = statistics.median(m["first"] - m["launch"] for m in runs[name]) - before_bare
        after = statistics.median(m["end"] - m["last"] for m in runs[name]) - after_bare
        inside = statistics.median(m["last"] - m["first"] for m in runs[name]) - statistics.median(
            m["last"] - m["first"] for m in bare_runs)
        print(f"\n{name}: {before * 1e3:.0f} ms more than the bare worker before the rank's first line, "
              f"{inside * 1e3:+.0f} ms inside the rank, {after * 1e3:.0f} ms more after its last line")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
