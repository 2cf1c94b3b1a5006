"""Seconds per 2-rank CPU test: ddpboot's pytest plugin with warm ranks, the plugin with a launcher per test
(`--ddp-cold`), and torch's own `MultiProcessTestCase` (torch.testing._internal.common_distributed), in one run.

    .venv/bin/python benchmarks/bench_testing.py [--tests 20] [--rounds 2]

Each way runs the same suite of N tests (each: init, one all_reduce of a small tensor, an assertion, destroy) as one
`python -m pytest` session; the figures per way are the session's wall time (what CI pays, including the warm
process's one-time start), the median of pytest's per-test call times (the steady cost of one more test) and the
CPU seconds of all the session's processes (what does not change when other work shares the machine).
Rounds alternate the three ways so that a machine getting busier affects all alike. Nothing here asserts a speed;
benchmarks/RESULTS.md keeps the numbers with the machine they came from.
"""

from __future__ import annotations

import argparse
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

PLUGIN_SUITE = """
import pytest


@pytest.mark.ddp(nproc=2)
@pytest.mark.parametrize("i", range({n}))
def test_all_reduce(ddp_ctx, i):
    import torch
    import torch.distributed as dist

    t = torch.ones(4) * (ddp_ctx.rank + i)
    dist.all_reduce(t)
    assert t.tolist() == [1.0 + 2 * i] * 4
"""

TORCH_SUITE = """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests


class AllReduce(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def _check(self, i):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(4) * (self.rank + i)
        dist.all_reduce(t)
        assert t.tolist() == [1.0 + 2 * i] * 4
        dist.destroy_process_group()


for _i in range({n}):
    setattr(AllReduce, f"test_all_reduce_{{_i}}", lambda self, i=_i: self._check(i))

if __name__ == "__main__":
    run_tests()
"""

WAYS = {
    "plugin, warm ranks": ("test_plugin.py", PLUGIN_SUITE, []),
    "plugin, launcher per test (--ddp-cold)": ("test_plugin.py", PLUGIN_SUITE, ["--ddp-cold"]),
    "torch MultiProcessTestCase": ("test_torch_mpc.py", TORCH_SUITE, []),
}


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_way(way: str, n: int, work: Path) -> tuple[float, float, float]:
    """(session wall seconds, median per-test call seconds, CPU seconds of every process of the session) of one
    pytest session of n tests. The CPU figure does not depend on how busy the machine is: every process of the
    session is reaped within it, so RUSAGE_CHILDREN's growth counts them all."""
    name, suite, extra = WAYS[way]
    d = Path(tempfile.mkdtemp(dir=work))
    (d / name).write_text(suite.format(n=n))
    xml = d / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPBOOT_", "PYTEST_"))}
    t0, c0 = time.monotonic(), _cpu()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                          *extra, name], cwd=d, env=env, capture_output=True, text=True, timeout=1800)
    wall, cpu = time.monotonic() - t0, _cpu() - c0
    cases = ET.parse(xml).getroot().iter("testcase")
    times = [float(c.get("time", "nan")) for c in cases]
    if out.returncode != 0 or len(times) != n:
        raise RuntimeError(f"{way}: pytest exit {out.returncode}, {len(times)} of {n} tests\n{out.stdout[-3000:]}")
    return wall, statistics.median(times), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-cold", action="store_true", help="leave out the launcher-per-test way (the slowest)")
    args = ap.parse_args()
    if args.skip_cold:
        del WAYS["plugin, launcher per test (--ddp-cold)"]
    import torch

    print(f"# {platform.node()}: {os.cpu_count()} cores, {platform.python_version()}, torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.1f}, {args.tests} tests x {args.rounds} rounds")
    results: dict[str, list[tuple[float, float, float]]] = {w: [] for w in WAYS}
    order = list(WAYS)
    with tempfile.TemporaryDirectory(prefix="bench-testing-") as tmp:
        for r in range(args.rounds):
            for way in order[r % len(order):] + order[: r % len(order)]:
                try:
                    results[way].append(run_way(way, args.tests, Path(tmp)))
                except RuntimeError as exc:  # e.g. MultiProcessTestCase needs expecttest (torch's test deps)
                    print(f"  round {r + 1}: {str(exc).splitlines()[0]}; its last lines:\n{str(exc)[-600:]}")
                    continue
                wall, per, cpu = results[way][-1]
                print(f"  round {r + 1}: {way}: {wall:.1f} s for the suite, {per:.3f} s per test, {cpu:.1f} CPU s",
                      flush=True)
    print(f"\n| way | suite of {args.tests}: wall s | per test, steady: wall s | suite: CPU s | suite vs warm |")
    print("|---|---|---|---|---|")
    warm = statistics.median(w for w, _, _ in results["plugin, warm ranks"]) if results["plugin, warm ranks"] else 0
    for way, runs in results.items():
        if not runs or not warm:
            continue
        wall = statistics.median(w for w, _, _ in runs)
        per = statistics.median(p for _, p, _ in runs)
        cpu = statistics.median(c for _, _, c in runs)
        print(f"| {way} | {wall:.1f} | {per:.3f} | {cpu:.1f} | {wall / warm:.1f}x |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
