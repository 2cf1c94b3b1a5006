"""ddpboot against torchrun: every benchmark case that applies to this machine, in alternating runs.

    .venv/bin/python benchmarks/run.py [--only CASE,...] [--pairs 5] [--append benchmarks/RESULTS.md] [--out DIR]

(`make bench` runs it with the defaults.) CPU cases run everywhere; GPU cases only where NVML shows enough GPUs, and
the skipped ones are listed with the reason. Each case alternates ddpboot and torchrun runs of the same work (order
rotated every pair) and reports the median and min–max of every measure and the ddpboot/torchrun ratio of medians.
Nothing is asserted about speed. The tables, headed by a description of the machine (CPU, GPUs, driver, torch, NCCL),
are printed and appended to --append; every run's raw numbers go to --out DIR as JSON (one file per case, plus
machine.json). See benchmarks/README.md for what each case measures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import bench_launch
from cases import CASES
from cases.common import PY, ROOT, Bench, CaseResult, job_env, log


def nvml_gpus() -> tuple[list[dict[str, Any]], str]:
    """The machine's GPUs from NVML (name, memory) and the driver, or ([], why there are none). NVML only: the
    benchmark driver never initialises CUDA."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA driver ({exc})"
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total)})
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        why = (f"driver {driver.decode() if isinstance(driver, bytes) else driver}, "
               f"CUDA driver API {cuda // 1000}.{cuda % 1000 // 10}")
        return gpus, why
    finally:
        pynvml.nvmlShutdown()


def torch_gpu_stack() -> str:
    """torch's CUDA and NCCL versions, asked of a fresh interpreter (importing torch here would add to the driver's
    footprint; torch.cuda.nccl.version() creates no CUDA context)."""
    code = ("import torch\nv = torch.version.cuda\nn = None\ntry:\n    n = torch.cuda.nccl.version()\n"
            "except Exception:\n    pass\nprint(v, '.'.join(map(str, n)) if isinstance(n, tuple) else n)")
    out = subprocess.run([PY, "-c", code], env=job_env(), capture_output=True, text=True).stdout.split()
    if len(out) != 2 or out[0] == "None":
        return "torch CPU build (no CUDA, no NCCL)"
    return f"torch CUDA {out[0]}, NCCL {out[1]}"


def describe_machine(gpus: list[dict[str, Any]], why: str) -> str:
    """bench_launch.machine() (CPU model and count, RAM, kernel, Python, torch, commit) plus the GPU side."""
    if gpus:
        names: dict[str, int] = {}
        for g in gpus:
            names[g["name"]] = names.get(g["name"], 0) + 1
        gpu = ", ".join(f"{n}× {name} ({gpus[0]['memory_total'] / 2**30:.0f} GiB)" for name, n in names.items())
        gpu_part = f"GPUs: {gpu}; {why}; {torch_gpu_stack()}"
    else:
        gpu_part = f"GPUs: none ({why}); {torch_gpu_stack()}"
    return f"{bench_launch.machine()}. {gpu_part}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated cases: " + ", ".join(c.name for c in CASES))
    ap.add_argument("--pairs", type=int, default=5, help="alternating ddpboot/torchrun pairs per case (default 5)")
    ap.add_argument("--append", type=Path, default=ROOT / "benchmarks" / "RESULTS.md",
                    help="markdown file the tables are appended to (default benchmarks/RESULTS.md)")
    ap.add_argument("--out", type=Path, help="directory for the raw JSON of every run (default: a new temp dir)")
    ap.add_argument("--train-steps", type=int, default=2000, help="examples/train.py --steps (default 2000)")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds the resources case's job stays alive")
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error("--pairs must be at least 1")
    known = {c.name: c for c in CASES}
    wanted = [s.strip() for s in a.only.split(",") if s.strip()] if a.only else list(known)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(known)}")
    out = a.out or Path(tempfile.mkdtemp(prefix="ddpboot-bench-"))
    out.mkdir(parents=True, exist_ok=True)

    gpus, why = nvml_gpus()
    machine = describe_machine(gpus, why)
    log(f"machine: {machine}")
    b = Bench(pairs=a.pairs, tmp=Path(tempfile.mkdtemp(prefix="bench-run-")), gpus=len(gpus),
              train_steps=a.train_steps, hold_s=a.hold)
    started = time.strftime("%Y-%m-%d %H:%M")
    results: list[CaseResult] = []
    skipped: list[str] = []
    failed: list[str] = []
    for name in wanted:
        case = known[name]
        if len(gpus) < case.min_gpus:
            skipped.append(f"`{name}`: needs {case.min_gpus} GPU(s), NVML shows {len(gpus)}"
                           f"{'' if gpus else f' ({why})'}")
            log(f"skip {skipped[-1]}")
            continue
        log(f"case {name}: {case.what}")
        t0 = time.monotonic()
        try:
            res = case.run(b)
        except Exception as exc:  # one broken case must not lose the others' numbers
            traceback.print_exc()
            failed.append(f"`{name}`: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        res.raw["took_s"] = time.monotonic() - t0
        results.append(res)
        (out / f"{name}.json").write_text(json.dumps(asdict(res), indent=1, default=str))
        print(res.markdown() + "\n", flush=True)
    (out / "machine.json").write_text(json.dumps({"description": machine, "gpus": gpus, "nvml": why,
                                                  "pairs": a.pairs, "started": started, "argv": sys.argv}, indent=1))

    lines = [f"## Benchmark suite (benchmarks/run.py, {started})", "",
             f"Machine: {machine}.", "",
             f"Command: `{' '.join(['python', 'benchmarks/run.py', *sys.argv[1:]])}`; {a.pairs} pair(s) per case; "
             f"medians (min–max); ratios are ddpboot/torchrun medians. Raw runs: `{out}`.", ""]
    for res in results:
        lines += [res.markdown(), ""]
    if skipped:
        lines += ["Skipped: " + "; ".join(skipped) + ".", ""]
    if failed:
        lines += ["Failed: " + "; ".join(failed) + " (see the run's stderr).", ""]
    text = "\n".join(lines)
    if skipped or failed:
        print("\n".join(ln for ln in lines if ln.startswith(("Skipped", "Failed"))))
    with a.append.open("a") as f:
        f.write("\n" + text)
    log(f"appended to {a.append}; raw JSON in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
