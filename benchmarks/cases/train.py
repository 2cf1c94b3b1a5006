"""train, train-gpu: training throughput of examples/train.py under ddpboot and torchrun.

The launcher is not in the training loop, so the ratio should be 1 within noise (0.98–1.02); anything else points
at what the launcher sets up around the workers (CPU affinity, OMP_NUM_THREADS, device choice). Rank 0 prints
`step N  loss X  R samples/s`, where R is cumulative since the first step started; the time at step N is therefore
N·batch·world/R, and the steady rate is (N_last − N_first)/(t_last − t_first): steps per second after step 1 (which
carries DDP's first-iteration set-up). The last cumulative samples/s is reported too. `train` runs 2 gloo ranks on
CPU everywhere; `train-gpu` runs 2 NCCL ranks on GPUs. A third contender, ddpboot with `--cpu-affinity none`, tells
whether a difference comes from ddpboot's CPU binding (on a 2-core machine shared with other jobs, a rank pinned to
a busy core cannot move) rather than from the launcher.
"""

from __future__ import annotations

import re

from .common import (
    ROOT,
    Bench,
    CaseResult,
    Command,
    Run,
    alternate,
    ddpboot,
    job_env,
    ratio,
    run_logged,
    stats,
    torchrun,
)

BATCH = 64
WORLD = 2
NOBIND = "ddpboot --cpu-affinity none"
LINE = re.compile(r"step\s+(\d+)\s+loss\s+\S+\s+([\d,.]+) samples/s")


def throughput(output: str) -> tuple[float, float] | None:
    """(steady steps/s after step 1, last cumulative samples/s) from rank 0's log lines; None without two lines."""
    pts = [(int(m[1]), float(m[2].replace(",", ""))) for m in LINE.finditer(output)]
    if len(pts) < 2:
        return None
    (k0, r0), (k1, r1) = pts[0], pts[-1]
    t0, t1 = k0 * BATCH * WORLD / r0, k1 * BATCH * WORLD / r1
    return (k1 - k0) / (t1 - t0), r1


def run_train(b: Bench, gpu: bool) -> CaseResult:
    job = [str(ROOT / "examples" / "train.py"), "--steps", str(b.train_steps), "--batch-size", str(BATCH),
           "--log-every", str(max(b.train_steps // 10, 1))]
    extra = {} if gpu else ({"CUDA_VISIBLE_DEVICES": ""} if b.gpus else {})
    base = [] if gpu else ["--cpu"]
    contenders: dict[str, Command] = {
        "ddpboot": lambda: [*ddpboot(WORLD, *base), *job],
        "torchrun": lambda: [*torchrun(WORLD), *job],
        NOBIND: lambda: [*ddpboot(WORLD, *base, "--cpu-affinity", "none"), *job],
    }
    runs: dict[str, list[Run]] = {n: [] for n in contenders}
    steps: dict[str, list[float]] = {n: [] for n in contenders}
    samples: dict[str, list[float]] = {n: [] for n in contenders}
    for i, name in alternate(list(contenders), b.pairs):
        r = run_logged(name, contenders[name](), job_env(**extra), i)
        tp = throughput(r.output)
        if tp is None:
            raise RuntimeError(f"{name}: no 'samples/s' lines in the output:\n{r.output[-2000:]}")
        r.extra = {"steps_per_s": tp[0], "samples_per_s": tp[1]}
        runs[name].append(r)
        steps[name].append(tp[0])
        samples[name].append(tp[1])

    def f(x: float) -> str:
        return f"{x:,.1f}"

    def sec(x: float) -> str:
        return f"{x:.2f} s"

    walls = {n: [r.wall_s for r in rs] for n, rs in runs.items()}
    rows = []
    for label, data, fmt in (("steps/s after step 1", steps, f), ("samples/s (cumulative, last line)", samples, f),
                             ("job wall time", walls, sec)):
        rows.append([label, stats(data["ddpboot"], fmt), stats(data["torchrun"], fmt),
                     ratio(data["ddpboot"], data["torchrun"]), stats(data[NOBIND], fmt),
                     ratio(data[NOBIND], data["torchrun"])])
    backend = "NCCL on 2 GPUs" if gpu else "gloo, 2 CPU ranks"
    notes = [f"examples/train.py --steps {b.train_steps} --batch-size {BATCH}, {backend}; {b.pairs} alternating "
             "pairs. Expected ratio 0.98–1.02 within noise (reported, not asserted). ddpboot binds each rank to "
             "its share of the cores (--cpu-affinity auto); torchrun binds nothing: on a small CPU machine that, "
             "not the launcher, is what a difference would come from; the `--cpu-affinity none` columns (same "
             "rotation) separate the binding from the launcher."]
    name = "train-gpu" if gpu else "train"
    return CaseResult(name, f"Training throughput parity ({backend})",
                      ["measure", "ddpboot", "torchrun", "ddpboot/torchrun", NOBIND, "no-bind/torchrun"], rows, notes,
                      {"runs": {n: [r.record() for r in rs] for n, rs in runs.items()}})


def case_train(b: Bench) -> CaseResult:
    return run_train(b, gpu=False)


def case_train_gpu(b: Bench) -> CaseResult:
    return run_train(b, gpu=True)
