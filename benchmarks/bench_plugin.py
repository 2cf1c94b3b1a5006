"""The pytest plugin's cost per 2-rank CPU test with the machine's GPUs, with a simulated inventory of 8 GPUs and with
none, in one run: a test that asked for CPU ranks should cost the same whatever GPUs the machine has.

    PYTHONPATH=. python3 benchmarks/bench_plugin.py [--tests 20] [--repeat 3]

Each contender runs the same pytest session of N tests (`@pytest.mark.ddp(nproc=2)`, parametrized: init, one
all_reduce, an assertion; warm ranks, the plugin's default), differing only in DDPBOOT_FAKE_GPUS: unset (the
machine's GPUs through NVML: on a GPU host, the case CI suites are in), `8` (eight simulated GPUs) and `0` (no GPU:
the floor). A fourth session names a simulated inventory that cannot be read (a file that is not there): it passes
only if no part of a CPU test reads the GPUs. Per contender: the session's wall time, the median of pytest's
per-test call times (the steady cost of one more test) and the CPU seconds of the session's processes; medians over
--repeat rounds with their min–max, and each one's ratio to the no-GPU floor. Rounds rotate the order. Nothing here
asserts a speed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bench_testing import PLUGIN_SUITE as SUITE  # the same suite as bench_testing.py's

ROOT = Path(__file__).resolve().parent.parent

FLOOR = "no GPU (DDPBOOT_FAKE_GPUS=0)"
CONTENDERS = {
    "the machine's GPUs (NVML)": None,
    "8 simulated GPUs (DDPBOOT_FAKE_GPUS=8)": "8",
    FLOOR: "0",
    "an inventory that fails when read": "{tmp}/no-such-inventory.json",
}


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _plugin_args() -> list[str]:
    """`-p ddpboot.testing` where the plugin's entry point is not installed (a checkout on PYTHONPATH)."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    return [] if "ddpboot" in names else ["-p", "ddpboot.testing"]


def session(fake: str | None, n: int, work: Path, checkout: Path = ROOT) -> tuple[float, float, float]:
    """(wall s, median per-test call s, CPU s of every process of the session) of one pytest session, with the
    ddpboot of `checkout`."""
    d = Path(tempfile.mkdtemp(dir=work))
    (d / "test_plugin.py").write_text(SUITE.format(n=n))
    xml = d / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPBOOT_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), *filter(None, [env.get("PYTHONPATH")])])
    env["DDPBOOT_LOCK_DIR"] = str(d / "locks")
    if fake is not None:
        env["DDPBOOT_FAKE_GPUS"] = fake.format(tmp=d)
    t0, c0 = time.monotonic(), _cpu()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          *_plugin_args(), f"--junitxml={xml}", "test_plugin.py"],
                         cwd=d, env=env, capture_output=True, text=True, timeout=1800)
    wall, cpu = time.monotonic() - t0, _cpu() - c0
    times = [float(c.get("time", "nan")) for c in ET.parse(xml).getroot().iter("testcase")] if xml.exists() else []
    if out.returncode != 0 or len(times) != n:
        raise RuntimeError(f"pytest exit {out.returncode}, {len(times)} of {n} tests\n{out.stdout[-3000:]}")
    return wall, statistics.median(times), cpu


def _fmt(values: list[float], unit: str = "s", digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each runs every contender once")
    ap.add_argument("--baseline", type=Path, help="another checkout of ddpboot: its plugin measured alongside (with "
                    "the machine's GPUs and with none)")
    args = ap.parse_args()
    ways = {name: (fake, ROOT) for name, fake in CONTENDERS.items()}
    if args.baseline is not None:
        for name in ("the machine's GPUs (NVML)", FLOOR):
            ways[f"baseline: {name}"] = (CONTENDERS[name], args.baseline.resolve())
    print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.1f}; {args.tests} two-rank CPU tests per session, {args.repeat} rounds", flush=True)
    runs: dict[str, list[tuple[float, float, float]]] = {c: [] for c in ways}
    failed: dict[str, str] = {}
    order = list(ways)
    with tempfile.TemporaryDirectory(prefix="bench-plugin-") as tmp:
        for r in range(args.repeat):
            for name in order[r % len(order):] + order[: r % len(order)]:
                try:
                    fake, checkout = ways[name]
                    runs[name].append(session(fake, args.tests, Path(tmp), checkout))
                except RuntimeError as exc:
                    failed[name] = str(exc)
                    print(f"  round {r + 1}: {name}: FAILED: {str(exc)[-800:]}", flush=True)
                    continue
                wall, per, cpu = runs[name][-1]
                print(f"  round {r + 1}: {name}: {wall:.2f} s, {per:.3f} s per test, {cpu:.1f} CPU s", flush=True)
    floor = statistics.median(p for _, p, _ in runs[FLOOR]) if runs[FLOOR] else float("nan")
    print(f"\n| DDPBOOT_FAKE_GPUS | session of {args.tests}: wall | per test (median) | session CPU | per test / "
          "no-GPU floor |")
    print("|---|---|---|---|---|")
    for name, got in runs.items():
        if not got:
            print(f"| {name} | failed | | | |")
            continue
        per = [p for _, p, _ in got]
        print(f"| {name} | {_fmt([w for w, _, _ in got], digits=2)} | {_fmt(per)} | "
              f"{_fmt([c for _, _, c in got], 'CPU s', 1)} | {statistics.median(per) / floor:.2f}x |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
