"""The cost of collapsing lines said alike on the launcher's output path: lines per second through it, with and
without collapse, side by side.

    python benchmarks/bench_collapse.py [--ranks 8] [--lines 20000] [--repeat 5] [--e2e]

In process: `--ranks` RankStreams share one Console writing to /dev/null; each round every rank's pipe gives a read
of 16 lines and the Console's due work is done, as the attempt loop does after each wake-up. Two workloads:
`alike` (every rank prints the same lines: collapsed to one line each) and `distinct` (every line differs, so each
is held until the other ranks have moved past it: the worst case for holding). `--e2e` also runs the launcher
(`ddpboot --nproc N` of a plain Python script printing `--lines` lines per rank into a pipe the benchmark drains),
its wall time with and without `--no-collapse`. Each figure is the median of `--repeat` runs, the two modes
alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpboot.launch.logs import Console, RankStream
from ddpboot.launch.spec import LinePrefix, Std

READ = 16  # lines per pipe read


def chunks(rank: int, lines: int, alike: bool) -> list[bytes]:
    text = [b"step %d loss 0.%06d lr 3e-4 tokens/s 123456\n" % (i, i if alike else i * 31 + rank)
            for i in range(lines)]
    return [b"".join(text[i:i + READ]) for i in range(0, lines, READ)]


def in_process(ranks: int, lines: int, alike: bool, collapse: bool) -> float:
    """Lines per second (every rank's lines counted) through RankStream + Console."""
    null = os.open(os.devnull, os.O_WRONLY)
    console = Console(null, null, environ={})
    group = LinePrefix() if collapse else None
    streams = [RankStream(r, Std.OUT, console, None, group=group, slot=(r, 0)) for r in range(ranks)]
    data = [chunks(r, lines, alike) for r in range(ranks)]
    start = time.perf_counter()
    for round_ in zip(*data, strict=True):
        for stream, chunk in zip(streams, round_, strict=True):
            stream.feed(chunk)
        console.show_due()
    for stream in streams:
        stream.close()
    took = time.perf_counter() - start
    os.close(null)
    return ranks * lines / took


SCRIPT = """import os, sys
rank, n = int(os.environ["RANK"]), int(sys.argv[1])
out = sys.stdout
for i in range(n):
    out.write(f"step {i} loss 0.{i:06d} lr 3e-4 tokens/s 123456\\n")
out.flush()
"""


def end_to_end(ranks: int, lines: int, collapse: bool, script: Path) -> float:
    """The launcher's wall time, in seconds, for `ranks` ranks printing `lines` lines each (alike)."""
    argv = [sys.executable, "-m", "ddpboot", "--cpu", "--nproc", str(ranks), *([] if collapse else ["--no-collapse"]),
            str(script), str(lines)]
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--e2e", action="store_true")
    args = ap.parse_args()
    print(f"output path, {args.ranks} ranks x {args.lines} lines, median of {args.repeat} (lines per second, "
          "every rank's lines counted)")
    for alike in (True, False):
        runs: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.repeat):
            for collapse in ((True, False) if i % 2 == 0 else (False, True)):
                runs[collapse].append(in_process(args.ranks, args.lines, alike, collapse))
        on, off = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"  {'alike' if alike else 'distinct':8}  collapse {on:12,.0f}/s   --no-collapse {off:12,.0f}/s   "
              f"ratio {on / off:.2f}")
    if args.e2e:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "spew.py"
            script.write_text(SCRIPT)
            walls: dict[bool, list[float]] = {True: [], False: []}
            for i in range(args.repeat):
                for collapse in ((True, False) if i % 2 == 0 else (False, True)):
                    walls[collapse].append(end_to_end(args.ranks, args.lines, collapse, script))
            on, off = statistics.median(walls[True]), statistics.median(walls[False])
            total = args.ranks * args.lines
            print(f"  launcher  collapse {on:.2f} s ({total / on:,.0f} lines/s)   --no-collapse {off:.2f} s "
                  f"({total / off:,.0f} lines/s)   ratio {on / off:.2f}")


if __name__ == "__main__":
    main()
