"""`ddpboot plan --nproc 2`'s wall time, as hyperfine measures a command: warm-up runs, then alternating timed runs
of every contender, a fresh interpreter each; and where its time goes, by `python -X importtime`.

    PYTHONPATH=. python3 benchmarks/bench_plan.py [--repeat 20] [--baseline DIR]

Contenders: `python -c pass` (the interpreter's floor), `ddpboot plan --nproc 2` and `--json` from this checkout and,
with `--baseline DIR`, from another checkout of ddpboot (its directory first on PYTHONPATH), so that two commits are
measured side by side in one run. Printed: median and min–max per contender, its ratio to this checkout's table run,
then this checkout's import times by top-level package (cumulative, one -X importtime run), and whether torch or
pydantic were imported (neither should be). Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = ["-m", "ddpboot", "plan", "--nproc", "2"]


def env_for(checkout: Path) -> dict[str, str]:
    """The contender's environment; it runs in `checkout` too (`python -m` puts the working directory first on
    sys.path, before PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPBOOT_", "PET_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["BENCH_CWD"] = str(checkout)
    return env


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run; the CPU time moves less than the wall time when other work shares the machine."""
    t0, c0 = time.perf_counter(), _cpu()
    out = subprocess.run([sys.executable, *argv], env=env, cwd=env["BENCH_CWD"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if out.returncode != 0:
        raise RuntimeError(f"{argv}: exit {out.returncode}: {out.stderr.decode(errors='replace')[-2000:]}")
    return wall, cpu


def imports(env: dict[str, str]) -> tuple[dict[str, float], set[str]]:
    """Seconds per top-level package (cumulative) of one `plan` run, and every module it imported."""
    out = subprocess.run([sys.executable, "-X", "importtime", *PLAN], env=env, cwd=env["BENCH_CWD"],
                         capture_output=True, text=True)
    per: dict[str, float] = {}
    names: set[str] = set()
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        names.add(name.strip())
        if not name.startswith("  "):  # a top-level import: its cumulative time holds its children's
            top = name.strip().split(".")[0]
            per[top] = per.get(top, 0.0) + int(cumulative) / 1e6
    return per, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per contender (after 2 warm-up runs each)")
    ap.add_argument("--baseline", type=Path, help="another checkout of ddpboot, measured alongside")
    args = ap.parse_args()
    here = env_for(ROOT)
    contenders = {"python -c pass": (["-c", "pass"], here), "plan --nproc 2": (PLAN, here),
                  "plan --nproc 2 --json": ([*PLAN, "--json"], here)}
    if args.baseline is not None:
        base = env_for(args.baseline.resolve())
        contenders["baseline: plan --nproc 2"] = (PLAN, base)
        contenders["baseline: plan --nproc 2 --json"] = ([*PLAN, "--json"], base)
    print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.1f}; {args.repeat} alternating runs per contender after 2 warm-up runs", flush=True)
    for argv, env in contenders.values():
        for _ in range(2):
            timed(argv, env)
    walls: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(args.repeat):
        for name in order[r % len(order):] + order[: r % len(order)]:
            argv, env = contenders[name]
            walls[name].append(timed(argv, env))
    ref = [statistics.median(w[i] for w in walls["plan --nproc 2"]) for i in (0, 1)]
    print("\n| command | wall, median (min–max) | CPU, median (min–max) | / this checkout's plan --nproc 2 "
          "(wall, CPU) |")
    print("|---|---|---|---|")
    for name, got in walls.items():
        cells = []
        for i in (0, 1):
            v = [w[i] * 1e3 for w in got]
            cells.append(f"{statistics.median(v):.0f} ms ({min(v):.0f}–{max(v):.0f})")
        ratios = ", ".join(f"{statistics.median(w[i] for w in got) / ref[i]:.2f}x" for i in (0, 1))
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratios} |")
    per, names = imports(here)
    print("\nthis checkout's `plan --nproc 2` imports, by top-level package (one -X importtime run, cumulative):")
    print("\n| package | ms |\n|---|---|")
    for top, secs in sorted(per.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {top} | {secs * 1e3:.1f} |")
    print(f"| (all) | {sum(per.values()) * 1e3:.1f} |")
    print(f"\ntorch imported: {'yes' if 'torch' in names else 'no'}; pydantic imported: "
          f"{'yes' if 'pydantic' in names else 'no'}; load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
