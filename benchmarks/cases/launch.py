"""launch, launch-nccl: how long a launcher takes to run a tiny job, against torchrun and a bare worker.

The job (scripts/allreduce.py) inits the process group, all-reduces once and exits, so the wall time is almost all
launcher start-up, worker start-up (`import torch`), rendezvous and teardown. Measured for 2 ranks and 1 rank under
ddpboot and torchrun, and for one bare worker started by hand (`python allreduce.py` with RANK=0 WORLD_SIZE=1
MASTER_ADDR/PORT set): that is the floor no launcher can beat, so "overhead over bare" is what a launcher adds.
bench_launch.py measures the same 2-rank gloo job; this case extends it with the 1-rank and bare runs, NCCL, CPU time,
and the raw records.
"""

from __future__ import annotations

import statistics
from typing import Any

from .common import (
    PY,
    SCRIPTS,
    Bench,
    CaseResult,
    Command,
    Run,
    alternate,
    ddpboot,
    free_port,
    job_env,
    mib,
    ratio,
    run_logged,
    sec,
    stats,
    torchrun,
)


def _cpu(runs: list[Run]) -> list[float]:
    return [(r.launcher_cpu_s or 0.0) + r.guardian_cpu_s for r in runs]


def run_launch(b: Bench, backend: str) -> CaseResult:
    job = [str(SCRIPTS / "allreduce.py"), "--backend", backend]
    cpu_flag = ["--cpu"] if backend == "gloo" else []
    two = backend == "gloo" or b.gpus >= 2
    contenders: dict[str, Command] = {
        "ddpboot 1 rank": lambda: [*ddpboot(1, *cpu_flag), *job],
        "torchrun 1 rank": lambda: [*torchrun(1), *job],
        "bare worker": lambda: [PY, "-u", *job],
    }
    if two:
        contenders = {"ddpboot 2 ranks": lambda: [*ddpboot(2, *cpu_flag), *job],
                      "torchrun 2 ranks": lambda: [*torchrun(2), *job], **contenders}
    top_n = 2 if two else 1
    contenders[f"ddpboot --fast-start {top_n} rank{'s' if two else ''}"] = (
        lambda: [*ddpboot(top_n, *cpu_flag, "--fast-start"), *job])

    def env_for(name: str) -> dict[str, str]:
        if name == "bare worker":
            return job_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port()))
        return job_env()

    runs: dict[str, list[Run]] = {n: [] for n in contenders}
    warmup: list[dict[str, Any]] = []
    for name, cmd in contenders.items():  # page cache warm: the first torch import of a boot is not compared
        warmup.append(run_logged(name, cmd(), env_for(name), -1).record())
    for i, name in alternate(list(contenders), b.pairs):
        runs[name].append(run_logged(name, contenders[name](), env_for(name), i))

    def wall(n: str) -> list[float]:
        return [r.wall_s for r in runs.get(n, [])]

    bare = statistics.median(wall("bare worker"))
    rows = []
    for n in (2, 1) if two else (1,):
        label = f"{n} rank{'s' if n > 1 else ''}"
        d, t = f"ddpboot {label}", f"torchrun {label}"
        rows.append([f"{label}, {backend} init + all_reduce, launch → exit", stats(wall(d), sec), stats(wall(t), sec),
                     ratio(wall(d), wall(t))])
        rows.append([f"{label}: overhead over one bare worker ({sec(bare)})",
                     sec(statistics.median(wall(d)) - bare), sec(statistics.median(wall(t)) - bare),
                     ratio([x - bare for x in wall(d)], [x - bare for x in wall(t)])])
    top = "2 ranks" if two else "1 rank"
    fast = f"ddpboot --fast-start {top}"
    rows.insert(0, [f"{top}, {backend} init + all_reduce, launch → exit, **--fast-start**", stats(wall(fast), sec),
                    stats(wall(f"torchrun {top}"), sec), ratio(wall(fast), wall(f"torchrun {top}"))])
    dr, tr = runs[f"ddpboot {top}"], runs[f"torchrun {top}"]
    rows.append([f"{top}: launcher peak RSS", f"{stats([r.launcher_peak_rss for r in dr], mib)} + guardian "
                 f"{stats([r.guardian_peak_rss for r in dr], mib)}", stats([r.launcher_peak_rss for r in tr], mib),
                 ratio([r.launcher_peak_rss + r.guardian_peak_rss for r in dr], [r.launcher_peak_rss for r in tr])])
    rows.append([f"{top}: launcher CPU time (user+sys; ddpboot: launcher + guardian)", stats(_cpu(dr), sec),
                 stats(_cpu(tr), sec), ratio(_cpu(dr), _cpu(tr))])

    def job_cpu(n: str) -> list[float]:
        return [r.job_cpu_s for r in runs[n]]

    d_cpu, t_cpu = job_cpu(f"ddpboot {top}"), job_cpu(f"torchrun {top}")
    rows.append([f"{top}: CPU seconds per job (launcher and every process it started)", stats(d_cpu, sec),
                 stats(t_cpu, sec), ratio(d_cpu, t_cpu)])
    rows.append([f"{top}: CPU seconds per job, **--fast-start**", stats(job_cpu(fast), sec),
                 stats(job_cpu(f"torchrun {top}"), sec), ratio(job_cpu(fast), job_cpu(f"torchrun {top}"))])
    notes = [f"bare worker (floor): {stats(wall('bare worker'), sec)}; {b.pairs} alternating rounds of "
             f"{len(contenders)} contenders after one warm-up run each."]
    if not two:
        notes.append(f"2-rank runs skipped: NVML shows {b.gpus} GPU(s), 2 needed.")
    name = "launch" if backend == "gloo" else "launch-nccl"
    return CaseResult(name, f"Launch → exit, {backend}", ["measure", "ddpboot", "torchrun", "ddpboot/torchrun"], rows,
                      notes, {"warmup": warmup, "runs": {n: [r.record() for r in rs] for n, rs in runs.items()}})


def case_launch(b: Bench) -> CaseResult:
    return run_launch(b, "gloo")


def case_launch_nccl(b: Bench) -> CaseResult:
    return run_launch(b, "nccl")
