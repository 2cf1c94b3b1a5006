"""GPU-only cases: busbw (NCCL bandwidth under rank vs node isolation) and isolation (stray memory on GPU 0).

busbw: scripts/allreduce_bw.py under `ddpboot --isolation rank` (each worker sees only its GPU) and `--isolation
node` (every worker sees both, torchrun's semantics), alternating; bf16 all_reduce 1 MiB … 1 GiB, nccl-tests' busbw
(algbw × 2(n−1)/n). Rank isolation must not cost bandwidth: NCCL keeps P2P/CUMEM over NVLink with per-rank
CUDA_VISIBLE_DEVICES (FACTS §2). The transports NCCL reports (NCCL_DEBUG=INFO "via ..." lines) are recorded.

isolation: physical GPU 0's used memory (NVML, memory v2 where available, sampled every 50 ms) while
scripts/classic_leak.py runs: `ddpboot --gpus 1` (one rank on GPU 1: GPU 0 must stay at its baseline), `ddpboot
--gpus 0,1` (two ranks, rank isolation: GPU 0 holds rank 0 only), and `CUDA_VISIBLE_DEVICES=0,1 torchrun
--nproc-per-node 2` (the classic leak: rank 1 also opens a context on GPU 0). Where NVML lists processes (it may not
inside containers: FACTS §3), the memory that ranks *not* assigned GPU 0 hold on GPU 0 is reported directly.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .common import (
    SCRIPTS,
    Bench,
    CaseResult,
    alternate,
    ddpboot,
    job_env,
    log,
    mib,
    ratio,
    run_logged,
    stats,
    torchrun,
)

TRANSPORT = re.compile(r"via (\S+)")


def case_busbw(b: Bench) -> CaseResult:
    names = ["rank", "node"]
    per: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    raw: list[dict[str, Any]] = []
    transports: dict[str, set[str]] = {n: set() for n in names}
    for i, iso in alternate(names, b.pairs):
        out = Path(tempfile.mkdtemp(prefix="busbw-", dir=b.tmp)) / f"{iso}.json"
        cmd = [*ddpboot(2, "--isolation", iso), str(SCRIPTS / "allreduce_bw.py"), str(out)]
        r = run_logged(f"ddpboot --isolation {iso}", cmd, job_env(NCCL_DEBUG="INFO"), i)
        res = json.loads(out.read_text())
        transports[iso].update(TRANSPORT.findall(r.output))
        r.extra = {"bandwidth": res, "transports": sorted(set(TRANSPORT.findall(r.output)))}
        per[iso].append(res)
        raw.append(r.record())
    sizes = [x["bytes"] for x in per["rank"][0]["results"]]

    def gbps(x: float) -> str:
        return f"{x:.1f}"

    def bw(iso: str, k: int) -> list[float]:
        return [run["results"][k]["busbw_GBps"] for run in per[iso]]

    rows = []
    for k, size in enumerate(sizes):
        label = f"{size >> 20} MiB" if size < 1 << 30 else f"{size >> 30} GiB"
        rows.append([label, stats(bw("rank", k), gbps), stats(bw("node", k), gbps),
                     ratio(bw("rank", k), bw("node", k))])
    notes = [f"busbw in GB/s (10^9 B/s), 2 ranks, bf16, 20 timed iterations per size after 5 warm-ups; {b.pairs} "
             "alternating pairs. NCCL transports seen: rank isolation "
             f"{', '.join(sorted(transports['rank'])) or '(none reported)'}; node isolation "
             f"{', '.join(sorted(transports['node'])) or '(none reported)'}.",
             "Both columns are ddpboot; `--isolation node` is torchrun's visibility (every worker sees every GPU)."]
    return CaseResult("busbw", "NCCL all_reduce bus bandwidth, rank vs node isolation",
                      ["size", "--isolation rank (GB/s)", "--isolation node (GB/s)", "rank/node"], rows, notes,
                      {"runs": raw})


class Gpu0Sampler(threading.Thread):
    """Samples physical GPU 0 every 50 ms through NVML: used memory, and the compute processes NVML lists on it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, int]] = []
        self.procs: dict[int, int] = {}  # pid → peak used bytes on GPU 0
        self.done = threading.Event()

    def used(self) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=self.nvml.nvmlMemory_v2).used)
        except (self.nvml.NVMLError, AttributeError, TypeError):
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.done.is_set():
            self.samples.append((time.monotonic() - t0, self.used()))
            try:
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    self.procs[p.pid] = max(self.procs.get(p.pid, 0), int(p.usedGpuMemory or 0))
            except self.nvml.NVMLError:
                pass
            time.sleep(0.05)
        self.nvml.nvmlShutdown()


def case_isolation(b: Bench) -> CaseResult:
    script = str(SCRIPTS / "classic_leak.py")
    # contender → (command builder, environment extras, ranks whose own GPU is not physical GPU 0)
    contenders: dict[str, tuple[Any, dict[str, str], set[int]]] = {
        "ddpboot --gpus 1 (1 rank on GPU 1)": (lambda d: [*ddpboot(1, "--gpus", "1"), script, d], {}, {0}),
        "ddpboot --gpus 0,1 (2 ranks)": (lambda d: [*ddpboot(2, "--gpus", "0,1"), script, d], {}, {1}),
        "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2": (lambda d: [*torchrun(2), script, d],
                                                                  {"CUDA_VISIBLE_DEVICES": "0,1"}, {1}),
    }
    delta: dict[str, list[float]] = {n: [] for n in contenders}
    foreign: dict[str, list[float]] = {n: [] for n in contenders}
    raw: list[dict[str, Any]] = []
    for i, name in alternate(list(contenders), b.pairs):
        build, extra, others = contenders[name]
        pid_dir = Path(tempfile.mkdtemp(prefix="iso-", dir=b.tmp))
        time.sleep(1.0)  # let the previous job's memory be released before the baseline is read
        sampler = Gpu0Sampler()
        baseline = sampler.used()
        sampler.start()
        try:
            r = run_logged(name, build(str(pid_dir)), job_env(**extra), i)
        finally:
            sampler.done.set()
            sampler.join()
        peak = max((u for _, u in sampler.samples), default=baseline)
        ranks = {int(p.name[4:]): json.loads(p.read_text()) for p in Path(pid_dir).glob("rank*")}
        other_pids = {ranks[k]["pid"] for k in others if k in ranks}
        on_gpu0 = sum(m for pid, m in sampler.procs.items() if pid in other_pids) if sampler.procs else None
        delta[name].append(peak - baseline)
        if on_gpu0 is not None:
            foreign[name].append(on_gpu0)
        r.extra = {"gpu0_baseline": baseline, "gpu0_peak": peak, "gpu0_samples": sampler.samples,
                   "gpu0_processes": sampler.procs, "ranks": ranks, "foreign_ranks": sorted(others),
                   "foreign_on_gpu0": on_gpu0}
        raw.append(r.record())
        log(f"    GPU 0: baseline {mib(baseline)}, peak {mib(peak)}; foreign ranks on GPU 0: "
            f"{'n/a' if on_gpu0 is None else mib(on_gpu0)}")
    rows = [[name, stats(delta[name], mib), stats(foreign[name], mib) if foreign[name] else "n/a (NVML lists none)"]
            for name in contenders]
    names = list(contenders)
    leak = (statistics.median(delta[names[2]]) - statistics.median(delta[names[1]])) if delta[names[1]] else 0.0
    notes = [f"scripts/classic_leak.py: no set_device; barrier() and torch.cuda.synchronize() on the current device. "
             f"{b.pairs} alternating rounds. torchrun's extra GPU 0 memory over ddpboot's 2-rank run (rank 1's "
             f"stray context): {mib(leak)}; ddpboot/torchrun ratio of GPU 0 growth with 2 ranks: "
             f"{ratio(delta[names[1]], delta[names[2]])}.",
             "Column 3 counts only ranks whose own GPU is not GPU 0 (ddpboot --gpus 1: its one rank; 2 ranks: rank 1)."]
    return CaseResult("isolation", "Stray memory on GPU 0 (NVML, 50 ms samples)",
                      ["launch", "GPU 0 peak used − baseline", "held on GPU 0 by ranks assigned elsewhere"], rows,
                      notes, {"runs": raw})
