"""What every case shares: the contenders' command lines, the job environment, one watched run, statistics.

Built on bench_launch.py (the launcher's own benchmark): its environment cleaning, its peak-RSS watcher and its
machine description are used as they are; this module adds what the wider suite needs on top (CPU time, output
capture, GPU facts, per-run records for the raw JSON).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import bench_launch
from bench_launch import DDPBOOT, PY, ROOT, TORCHRUN, PeakWatch, children, comm, mib, ms, sec  # noqa: F401 - re-exported to the cases

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A port free now, for torchrun's --master-port (its default 29500 collides with other jobs on a shared box)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Command = Callable[[], list[str]]  # builds a contender's command line afresh for each run (torchrun: a new port)


def ddpboot(nproc: int, *extra: str) -> list[str]:
    return [*DDPBOOT, "--nproc", str(nproc), *extra]


def torchrun(nproc: int, *extra: str) -> list[str]:
    return [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(free_port()), *extra]


def job_env(**extra: str) -> dict[str, str]:
    """bench_launch's clean environment (no launcher variables inherited, private GPU lock dir), plus:
    NCCL_NVLS_ENABLE=0 for every job (NVLink multicast stays off on the shared GPU machines), and this checkout
    first on PYTHONPATH so that workers importing ddpboot measure the code being benchmarked."""
    env = bench_launch.clean_env()
    env["NCCL_NVLS_ENABLE"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def cpu_seconds(pid: int) -> float | None:
    """user+sys of this process alone (not its children), from /proc/PID/stat; readable from a zombie too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class GuardianCpuWatch(threading.Thread):
    """Samples the CPU time of ddpboot's guardian (the launcher's child named ddpboot-guard) every 20 ms. The
    launcher reaps it, so its last sample is what is reported: a lower bound by at most one interval."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.cpu = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for c in children(self.pid):
                if comm(c) == "ddpboot-guard":
                    self.cpu = max(self.cpu, cpu_seconds(c) or 0.0)
            time.sleep(0.02)


@dataclass
class Run:
    """One launch, as kept in the raw JSON."""

    contender: str
    cmd: list[str]
    wall_s: float
    rc: int
    launcher_peak_rss: int
    guardian_peak_rss: int
    launcher_cpu_s: float | None
    guardian_cpu_s: float
    job_cpu_s: float = 0.0  # user+sys of the launcher and every process of the job (all reaped within it)
    output: str = ""
    pair: int = -1
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self, keep_output: int = 4000) -> dict[str, Any]:
        d = asdict(self)
        d["output"] = self.output[-keep_output:]
        return d


def run_watched(contender: str, cmd: Sequence[str], env: dict[str, str], timeout: float = 900,
                check: bool = True) -> Run:
    """Start CMD, wait for it, and measure what the caller sees: wall time from start to exit, the launcher's peak
    RSS (bench_launch.PeakWatch: VmHWM polled every 5 ms, and the guardian's), its CPU time (user+sys, read from the
    exited process before it is reaped, so it is exact and excludes the workers) and the guardian's. Output (both
    streams) is kept for parsing."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(list(cmd), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    chunks: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=_drain, args=(proc.stdout, chunks), daemon=True)
    reader.start()
    peak, gcpu = PeakWatch(proc.pid), GuardianCpuWatch(proc.pid)
    peak.start()
    gcpu.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: /proc/PID/stat is final
        wall = time.monotonic() - start
        lcpu = cpu_seconds(proc.pid)
    finally:
        killer.cancel()
        peak.done.set()
        gcpu.done.set()
        proc.wait()
        with contextlib.suppress(OSError):  # leftovers of a launcher that did not clean up (torchrun after kill)
            os.killpg(proc.pid, 9)
    reader.join(timeout=10)
    peak.join()
    gcpu.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    job_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = b"".join(chunks).decode(errors="replace")
    run = Run(contender, list(cmd), wall, proc.returncode, peak.launcher, peak.guardian, lcpu, gcpu.cpu, job_cpu, out)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{contender}: {' '.join(cmd)} exited {proc.returncode}:\n{out[-3000:]}")
    return run


def run_logged(name: str, cmd: Sequence[str], env: dict[str, str], pair: int, check: bool = True) -> Run:
    """run_watched, tagged with its pair index (-1: warm-up) and a progress line on stderr."""
    r = run_watched(name, cmd, env, check=check)
    r.pair = pair
    log(f"  {'warm-up' if pair < 0 else f'pair {pair}'} {name}: {r.wall_s:.2f} s, exit {r.rc}")
    return r


def _drain(stream: IO[bytes], chunks: list[bytes]) -> None:
    for chunk in iter(lambda: stream.read(65536), b""):
        chunks.append(chunk)


def alternate(names: Sequence[str], pairs: int) -> Iterator[tuple[int, str]]:
    """(pair index, contender) with the order rotated every pair, so that a machine getting busier or quieter
    affects every contender alike."""
    for i in range(pairs):
        k = i % len(names)
        for name in [*names[k:], *names[:k]]:
            yield i, name


def stats(xs: Sequence[float], fmt: Callable[[float], str]) -> str:
    """median (min–max), bench_launch's format; '—' for no samples."""
    return bench_launch.stats(xs, fmt) if xs else "—"


def ratio(a: Sequence[float], b: Sequence[float]) -> str:
    """median(a) / median(b), the ddpboot/torchrun convention (below 1: ddpboot smaller)."""
    if not a or not b or statistics.median(a) <= 0 or statistics.median(b) <= 0:
        return "—"  # a ratio of a negative or zero quantity (an overhead lost in noise) means nothing
    return f"{statistics.median(a) / statistics.median(b):.2f}×"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Bench:
    """What a case gets from the driver."""

    pairs: int
    tmp: Path
    gpus: int
    train_steps: int
    hold_s: float


@dataclass
class CaseResult:
    """One case's table (its own columns), notes under it, and every run's raw record."""

    name: str
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        lines = [f"### {self.title} (`{self.name}`)", "", "| " + " | ".join(self.headers) + " |",
                 "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.notes:
            lines += ["", *(f"- {n}" for n in self.notes)]
        return "\n".join(lines)


__all__ = ["DDPBOOT", "PY", "ROOT", "SCRIPTS", "TORCHRUN", "Bench", "CaseResult", "Command", "Run"]
