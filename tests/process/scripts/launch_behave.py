"""A worker for launcher tests that imports no torch: it does what its flags say, on the ranks they name.

Each rank writes what it saw to OUTDIR/rank<R>.json (env, argv, signals received) and announces readiness by
creating OUTDIR/ready<R> once its signal handlers are installed, so a test can wait for that instead of sleeping.

    --exit RANK:CODE          exit with CODE on RANK (after the other actions)
    --await-all               once ready, wait until every rank is ready (so a failure finds the others set up)
    --exit-attempts N         ... only while TORCHELASTIC_RESTART_COUNT < N
    --ignore SIG              ignore this signal (e.g. TERM): the launcher must SIGKILL us
    --count SIG               count deliveries of SIG (USR1, INT, TERM...), keep running
    --stop-on SIG             on SIG, record it and exit 0
    --hold                    after the actions, wait until OUTDIR/release exists or a stop signal arrives
    --child                   start a grandchild (`sleep`) in our process group; its pid goes into the report
    --lines N                 print N numbered lines to stdout (in odd-sized chunks) and N/2 to stderr
    --burst BYTES             write BYTES of numbered lines to stdout, then die of SIGKILL (nothing flushed after)
    --progress                write \\r progress fragments, waiting for OUTDIR/go between the first and the rest
    --linger SECONDS          at the end, close stdout/stderr and wait before exiting (as a GPU process does while
                              its driver tears down: the launcher sees EOF well before the exit)
    --store-probe             talk to the store (torch's protocol, by hand): report whether `probe` exists, set it
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))
OUT = Path(os.environ["LAUNCH_TEST_OUT"])
received: dict[str, int] = {}
stop_now = False


def report(extra: dict[str, object] | None = None) -> None:
    data = {
        "rank": RANK,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "argv": sys.argv[1:],
        "env": dict(os.environ),
        "received": received,
        "affinity": sorted(os.sched_getaffinity(0)),
    }
    data.update(extra or {})
    tmp = OUT / f"rank{RANK}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(OUT / f"rank{RANK}.json")


def on_count(sig: int, _frame: object) -> None:
    name = signal.Signals(sig).name
    received[name] = received.get(name, 0) + 1
    report(extras)


def on_stop(sig: int, _frame: object) -> None:
    global stop_now
    on_count(sig, _frame)
    stop_now = True


def mine(spec: list[str]) -> list[str]:
    """Values of RANK:VALUE flags that apply to this rank ('*' = every rank)."""
    out = []
    for item in spec:
        rank, _, value = item.partition(":")
        if rank == "*" or int(rank) == RANK:
            out.append(value)
    return out


def store_probe() -> dict[str, object]:
    """A minimal TCPStore client (VALIDATE, CHECK, SET): is there a key left over from an earlier attempt?"""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    key = b"/probe"
    with socket.create_connection((addr, port), timeout=10) as s:
        s.sendall(struct.pack("=BI", 0, 0x3C85F7CE))
        s.sendall(struct.pack("=BQQ", 5, 1, len(key)) + key)  # CHECK [probe]
        existed = s.recv(1) == b"\x00"
        value = str(os.environ.get("TORCHELASTIC_RESTART_COUNT")).encode()
        s.sendall(struct.pack("=BQ", 1, len(key)) + key + struct.pack("=Q", len(value)) + value)  # SET
        s.sendall(struct.pack("=BQQ", 5, 1, len(key)) + key)  # CHECK again: the SET has been applied
        assert s.recv(1) == b"\x00"
    return {"probe_existed": existed}


extras: dict[str, object] = {}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exit", action="append", default=[])
    p.add_argument("--exit-attempts", type=int, default=None)
    p.add_argument("--ignore", action="append", default=[])
    p.add_argument("--count", action="append", default=[])
    p.add_argument("--stop-on", action="append", default=[])
    p.add_argument("--hold", action="append", default=[])
    p.add_argument("--child", action="store_true")
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--burst", action="append", default=[])
    p.add_argument("--progress", action="append", default=[])
    p.add_argument("--store-probe", action="store_true")
    p.add_argument("--linger", type=float, default=0.0)
    p.add_argument("--await-all", action="store_true")
    p.add_argument("rest", nargs="*")
    a = p.parse_args()

    for name in a.ignore:
        signal.signal(getattr(signal, "SIG" + name), signal.SIG_IGN)
    for name in a.count:
        signal.signal(getattr(signal, "SIG" + name), on_count)
    for name in a.stop_on:
        signal.signal(getattr(signal, "SIG" + name), on_stop)
    if a.child:
        child = subprocess.Popen(["sleep", "300"])
        extras["child"] = child.pid
    if a.store_probe:
        extras.update(store_probe())
    report(extras)
    (OUT / f"ready{RANK}").touch()
    if a.await_all:
        world = int(os.environ["WORLD_SIZE"])
        deadline = time.monotonic() + 60
        while not all((OUT / f"ready{r}").exists() for r in range(world)) and time.monotonic() < deadline:
            time.sleep(0.01)

    if a.lines:
        for i in range(a.lines):
            text = f"out {RANK} line {i} " + "x" * (i % 37) + "\n"
            half = len(text) // 3  # odd-sized writes: lines arrive split across reads
            os.write(1, text[:half].encode())
            os.write(1, text[half:].encode())
            if i % 2 == 0:
                os.write(2, f"err {RANK} line {i}\n".encode())
    for size in mine(a.burst):
        n, i = int(size), 0
        chunks = []
        while n > 0:
            line = f"burst {RANK} {i:07d}\n"
            chunks.append(line)
            n -= len(line)
            i += 1
        data = "".join(chunks).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
        os.kill(os.getpid(), signal.SIGKILL)
    if mine(a.progress):
        os.write(2, b"\rstep 1/3")
        deadline = time.monotonic() + 60
        while not (OUT / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.write(2, b"\rstep 2/3\rstep 3/3\n")
    if mine(a.hold):
        deadline = time.monotonic() + 120
        while not stop_now and not (OUT / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if a.linger:
        sys.stdout.flush()
        sys.stderr.flush()
        os.close(1)
        os.close(2)
        time.sleep(a.linger)
        os._exit(0)
    codes = mine(a.exit)
    if codes:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if a.exit_attempts is None or restart < a.exit_attempts:
            sys.stdout.flush()
            raise SystemExit(int(codes[0]))


if __name__ == "__main__":
    main()
