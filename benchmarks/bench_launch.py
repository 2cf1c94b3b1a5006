"""ddpboot's launcher against torchrun, on the same scripts, in alternating runs.

    .venv/bin/python benchmarks/bench_launch.py [--pairs 5] [--append benchmarks/RESULTS.md]

What is measured (medians, min–max, and ddpboot/torchrun ratios):

- launch → exit of a 2-rank gloo job (init_process_group + one all_reduce + destroy; `--backend nccl`: on 2 GPUs),
  wall time seen by the caller;
  also with `--store torch` (torch's own TCPStore server in ddpboot's guardian), the mechanism ddpboot does not use
  by default, to keep the numbers behind that choice reproducible;
- rank failure → launcher exit: rank 1 exits 3 right after writing its timestamp, rank 0 sleeps (and dies on
  SIGTERM); the latency is from that timestamp to the launcher's exit, and the launcher's exit code is recorded;
- launcher peak RSS (VmHWM of the launcher process, polled during the gloo job; for ddpboot also the guardian);
- `kill -9` of the launcher while each rank has a child process: how long until every worker and child is gone.

Runs alternate (ddpboot, torchrun, ddpboot --store torch, then rotated) so that a machine getting busier or quieter
affects all alike. Nothing here asserts a speed; RESULTS.md keeps the numbers with the machine they came from.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _ddpboot_command() -> list[str]:
    """The `ddpboot` console script next to this interpreter when it runs this interpreter, else `python -m ddpboot`
    (a machine may have a `ddpboot` script installed for another Python next to this one)."""
    script = Path(PY).with_name("ddpboot")
    try:
        first = script.read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return [PY, "-m", "ddpboot"]
    if first.startswith("#!") and Path(first[2:].strip().split()[0]).resolve() == Path(PY).resolve():
        return [str(script)]
    return [PY, "-m", "ddpboot"]


DDPBOOT = _ddpboot_command()
TORCHRUN = [PY, "-m", "torch.distributed.run"]

JOB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t[0].item() == 3.0
dist.destroy_process_group()
"""

JOB_NCCL = """
import os, torch, torch.distributed as dist
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda") * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t[0].item() == 3.0
dist.destroy_process_group()
"""

FAIL = """
import os, sys, time
if os.environ["RANK"] == "1":
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
time.sleep(120)
"""

ORPHAN = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
with open(os.path.join(sys.argv[1], "pids%s" % os.environ["RANK"]), "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
time.sleep(300)
"""

CONTENDERS: dict[str, list[str]] = {
    "ddpboot": [*DDPBOOT, "--nproc", "2"],
    "torchrun": [*TORCHRUN, "--nproc-per-node", "2"],
    "ddpboot --store torch": [*DDPBOOT, "--nproc", "2", "--store", "torch"],
}


def clean_env() -> dict[str, str]:
    drop = ("PET_", "DDPBOOT_", "TORCHELASTIC_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
              "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env["DDPBOOT_LOCK_DIR"] = tempfile.mkdtemp(prefix="bench-locks-")
    return env


def vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class PeakWatch(threading.Thread):
    """Polls the launcher's (and ddpboot's guardian's) VmHWM until the launcher exits."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.launcher = 0
        self.guardian = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            hwm = vm_hwm(self.pid)
            if hwm:
                self.launcher = max(self.launcher, hwm)
            for c in children(self.pid):
                if comm(c) == "ddpboot-guard":
                    self.guardian = max(self.guardian, vm_hwm(c) or 0)
            time.sleep(0.005)


def run_job(cmd: Sequence[str], script: Path, env: dict[str, str]) -> tuple[float, int, int, int]:
    start = time.monotonic()
    proc = subprocess.Popen([*cmd, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watch = PeakWatch(proc.pid)
    watch.start()
    _, err = proc.communicate(timeout=300)
    took = time.monotonic() - start
    watch.done.set()
    watch.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return took, watch.launcher, watch.guardian, proc.returncode


def run_failure(cmd: Sequence[str], script: Path, env: dict[str, str], tmp: Path) -> tuple[float, int]:
    stamp = tmp / "failed_at"
    stamp.unlink(missing_ok=True)
    proc = subprocess.Popen([*cmd, str(script), str(stamp)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    proc.wait(timeout=300)
    ended = time.time()
    with_children_gone(proc.pid)
    return ended - float(stamp.read_text()), proc.returncode


def with_children_gone(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_kill9(cmd: Sequence[str], script: Path, env: dict[str, str], tmp: Path) -> tuple[float | None, int]:
    """Seconds until every worker and worker child is gone after kill -9 of the launcher (None: not within 5 s)."""
    d = tmp / "orphans"
    d.mkdir(exist_ok=True)
    for p in d.iterdir():
        p.unlink()
    proc = subprocess.Popen([*cmd, str(script), str(d)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(list(d.glob("pids*"))) < 2:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"{cmd}: the ranks did not start")
        time.sleep(0.01)
    pids = [int(x) for p in d.glob("pids*") for x in p.read_text().split()]
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    took: float | None = None
    while time.monotonic() - killed < 5:
        if not any(alive(p) for p in pids):
            took = time.monotonic() - killed
            break
        time.sleep(0.005)
    left = sum(alive(p) for p in pids)
    for p in pids:  # clean up torchrun's orphans
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    return took, left


def sec(x: float) -> str:
    return f"{x:.2f} s"


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms"


def mib(x: float) -> str:
    return f"{x / 2**20:.0f} MiB"


def stats(xs: Sequence[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}–{fmt(max(xs))})"


def machine() -> str:
    model = mem = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kib = next((int(ln.split()[1]) for ln in f if ln.startswith("MemTotal")), 0)
        mem = f"{kib / 1024**2:.0f} GiB"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    return (f"{model}, {len(os.sched_getaffinity(0))} cores usable ({os.cpu_count()} online), {mem} RAM, "
            f"Linux {platform.release()}, Python {platform.python_version()}, "
            f"torch {importlib.metadata.version('torch')}, ddpboot commit {commit}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="alternating runs of each contender (at least 5)")
    ap.add_argument("--append", type=Path, help="append the results section to this markdown file")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                    help="nccl: the job runs on 2 GPUs (one per rank; ddpboot picks free ones)")
    a = ap.parse_args()
    env = clean_env()
    tmp = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    job, fail, orphan = tmp / "job.py", tmp / "fail.py", tmp / "orphan.py"
    job.write_text(JOB_NCCL if a.backend == "nccl" else JOB)
    fail.write_text(FAIL)
    orphan.write_text(ORPHAN)

    names = list(CONTENDERS)
    for name in names:  # warm the page cache: the first torch import of a boot is not what we compare
        run_job(CONTENDERS[name], job, env)
    wall: dict[str, list[float]] = {n: [] for n in names}
    rss: dict[str, list[int]] = {n: [] for n in names}
    guard: dict[str, list[int]] = {n: [] for n in names}
    for i in range(a.pairs):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            took, peak, g, _ = run_job(CONTENDERS[name], job, env)
            wall[name].append(took)
            rss[name].append(peak)
            guard[name].append(g)
            print(f"job {i} {name}: {took:.2f} s, launcher peak RSS {peak / 2**20:.0f} MiB", file=sys.stderr)

    fail_lat: dict[str, list[float]] = {"ddpboot": [], "torchrun": []}
    fail_code: dict[str, set[int]] = {"ddpboot": set(), "torchrun": set()}
    for i in range(a.pairs):
        for name in (["ddpboot", "torchrun"] if i % 2 == 0 else ["torchrun", "ddpboot"]):
            lat, code = run_failure(CONTENDERS[name], fail, env, tmp)
            fail_lat[name].append(lat)
            fail_code[name].add(code)
            print(f"failure {i} {name}: {lat:.3f} s, exit {code}", file=sys.stderr)

    kill9: dict[str, tuple[float | None, int]] = {}
    for name in ("ddpboot", "torchrun"):
        kill9[name] = run_kill9(CONTENDERS[name], orphan, env, tmp)

    tr = statistics.median(wall["torchrun"])
    lines = [
        f"## Launcher (benchmarks/bench_launch.py, {time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {machine()}. {a.pairs} alternating runs per contender after one warm-up run each.",
        "",
        "| measure | ddpboot | torchrun | ddpboot --store torch |",
        "|---|---|---|---|",
        f"| 2-rank {a.backend} init + all_reduce, launch → exit | {stats(wall['ddpboot'], sec)} | "
        f"{stats(wall['torchrun'], sec)} | {stats(wall['ddpboot --store torch'], sec)} |",
        f"| ratio to torchrun (medians) | {statistics.median(wall['ddpboot']) / tr:.2f}× | 1.00× | "
        f"{statistics.median(wall['ddpboot --store torch']) / tr:.2f}× |",
        f"| launcher peak RSS | {stats(rss['ddpboot'], mib)} (guardian {stats(guard['ddpboot'], mib)}) | "
        f"{stats(rss['torchrun'], mib)} | {stats(rss['ddpboot --store torch'], mib)} "
        f"(guardian {stats(guard['ddpboot --store torch'], mib)}) |",
        f"| rank 1 exits 3 → launcher exit | {stats(fail_lat['ddpboot'], ms)}, exit code "
        f"{'/'.join(map(str, sorted(fail_code['ddpboot'])))} | {stats(fail_lat['torchrun'], ms)}, exit code "
        f"{'/'.join(map(str, sorted(fail_code['torchrun'])))} | |",
    ]
    k = {n: (f"all gone after {ms(t)}" if t is not None else f"{left} of 4 still alive after 5 s")
         for n, (t, left) in kill9.items()}
    lines.append(f"| kill -9 of the launcher (2 workers, each with a child) | {k['ddpboot']} | {k['torchrun']} | |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.append:
        with a.append.open("a") as f:
            f.write("\n" + text + "\n")


if __name__ == "__main__":
    main()
