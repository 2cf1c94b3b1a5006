"""Run one job N times, one at a time, and count how it exited: the evidence behind "exit 0 in N consecutive runs".

    nice -n 10 .venv/bin/python benchmarks/exit_reliability.py --runs 200 --busy --label "train.py, --cpu" -- \\
        .venv/bin/ddpboot --cpu --nproc 2 examples/train.py --steps 20

Everything after `--` is the job's command line, run from the current directory. `{out}` in it (or in a `--env`
value) becomes a new empty directory for each run, for clients that write their results somewhere
(`LAUNCH_TEST_OUT={out}`). `--busy` starts a child that keeps one core busy (a Python busy-loop) for the whole
series and stops it at the end: the timing in which gloo's threads used to abort a rank at interpreter exit
(exit 134, benchmarks/RESULTS.md). Core dumps are not collected (`ulimit -c` does not matter here).

`--for-seconds S` starts no run after S seconds, for a series that must end by a given time (the row counts the
runs made). Prints one line per run that did not exit 0 (with the tail of its output, and saves the whole output
under `--keep DIR` where given), then one Markdown row:

    | label | runs | exit 0 | other exits | median s |
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

BUSY_LOOP = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_core(enabled: bool) -> Iterator[None]:
    """One core kept busy by a child process for as long as the block runs (nothing when not enabled)."""
    if not enabled:
        yield
        return
    child = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        child.kill()
        child.wait()


def one_run(command: list[str], env_extra: dict[str, str], timeout: float, keep: Path | None,
            index: int) -> tuple[int, float, str]:
    """Run the command once; its exit code (-9 when killed at the timeout), wall seconds and output."""
    with tempfile.TemporaryDirectory(prefix="exit-reliability-") as out:
        argv = [part.replace("{out}", out) for part in command]
        env = {**os.environ, **{k: v.replace("{out}", out) for k, v in env_extra.items()}}
        start = time.monotonic()
        with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) as proc:
            try:
                output, _ = proc.communicate(timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:  # the whole job goes: the launcher and every rank it started
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                code, output = -9, f"{output}\n(killed after {timeout:.0f} s)"
        seconds = time.monotonic() - start
    if code != 0 and keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"run{index:04d}.exit{code}.log").write_text(f"$ {shlex.join(argv)}\n{output}")
    return code, seconds, output


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        sys.exit("exit_reliability: error: no job given; put its command line after `--`")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="exit_reliability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="consecutive runs (default 200)")
    parser.add_argument("--busy", action="store_true", help="keep one core busy for the whole series")
    parser.add_argument("--label", default=None, help="the row's first column (default: the command line)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one run may take (default 120)")
    parser.add_argument("--for-seconds", type=float, default=None,
                        help="start no run after this many seconds; the row counts the runs made")
    parser.add_argument("--keep", type=Path, default=None, help="save the output of every failed run here")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command or args.runs < 1:
        parser.error("give --runs >= 1 and a command after `--`")
    return args, command


def main(argv: list[str]) -> int:
    args, command = parse(argv)
    env_extra = dict(item.split("=", 1) for item in args.env)
    codes: Counter[int] = Counter()
    seconds: list[float] = []
    deadline = None if args.for_seconds is None else time.monotonic() + args.for_seconds
    with busy_core(args.busy):
        for index in range(args.runs):
            if deadline is not None and time.monotonic() > deadline:
                break
            code, wall, output = one_run(command, env_extra, args.timeout, args.keep, index)
            codes[code] += 1
            seconds.append(wall)
            if code != 0:
                tail = " | ".join(output.strip().splitlines()[-3:])
                print(f"run {index + 1}: exit {code} after {wall:.1f} s: {tail[-300:]}", flush=True)
    label = args.label or shlex.join(command)
    others = ", ".join(f"{n}× exit {code}" for code, n in sorted(codes.items()) if code != 0) or "none"
    busy = ", one core busy" if args.busy else ""
    runs = len(seconds)
    print(f"| {label}{busy} | {runs} | {codes[0]} | {others} | {statistics.median(seconds):.1f} |", flush=True)
    return 0 if codes[0] == runs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
