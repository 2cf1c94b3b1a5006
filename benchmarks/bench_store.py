"""ddpboot's store server with and without the owner check (ddpboot/tcpstore/owner.py): a burst of clients and the
accept-to-first-reply latency.

    python3 benchmarks/bench_store.py --clients 8192 --procs 16 --rounds 5 --latency 1000

Each round starts a fresh server process per mode (`check`: the default, loopback connections judged by uid through
sock_diag netlink; `open`: allowed_uids=None, no check), on a socket bound as the launcher binds it
(tcpstore/address.py: loopback, the same listen backlog). Then:

- burst: `--procs` client processes, released together, open `--clients` connections in all at once (non-blocking
  connects), each sends torch's VALIDATE and a GETNUMKEYS and waits for the 8-byte answer; the wall time from the
  release to the last answer, and the median and 99th percentile of each client's connect-to-answer time;
- latency: one client, `--latency` times in a row: connect, VALIDATE + GETNUMKEYS, answer, close (median).

Modes alternate within each round (the order rotates) so that a machine getting busier affects both alike. The
server raises its open-file limit to the hard limit; each client process holds clients/procs connections. Nothing
is asserted: the medians and min-max are printed as a Markdown table (benchmarks/RESULTS.md keeps the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
REQUEST = struct.pack("=BIB", 0, 0x3C85F7CE, 7)  # VALIDATE (magic), then GETNUMKEYS: answered with 8 bytes

SERVER = """
import resource, selectors, sys
from ddpboot.tcpstore.address import bind_store_socket
from ddpboot.tcpstore.server import StoreServer
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
listener = bind_store_socket("127.0.0.1", None, listeners=int(sys.argv[2]) if len(sys.argv) > 2 else 1)
options = {} if sys.argv[1] == "check" else {"allowed_uids": None}
server = StoreServer(listener, **options)
sel = selectors.DefaultSelector()
server.register(sel)
print(listener.getsockname()[1], flush=True)
while True:
    for key, events in sel.select():
        server.handle(key, events)
"""


def start_server(mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, mode], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def burst_client(port: int, count: int, release: float) -> dict[str, object]:
    """Open `count` connections at `release` (a time.time() instant), one round trip each; times in seconds."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    while time.time() < release:
        time.sleep(min(0.001, max(release - time.time(), 0)))
    sel = selectors.DefaultSelector()
    started: dict[int, float] = {}
    got: dict[int, bytes] = {}
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started[sock.fileno()] = time.monotonic()
        sock.connect_ex(("127.0.0.1", port))
        sel.register(sock, selectors.EVENT_WRITE)
        socks.append(sock)
    took: list[float] = []
    reasons: list[str] = []
    failed = 0  # refused or reset: counted to end the wait early
    deadline = time.monotonic() + 120
    while len(took) + failed < count and time.monotonic() < deadline:
        for key, events in sel.select(1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            fd = sock.fileno()
            if events & selectors.EVENT_WRITE:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    reasons.append(f"connect: {os.strerror(error)}")
                    failed += 1
                    sel.unregister(sock)
                    continue
                sock.send(REQUEST)
                sel.modify(sock, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(8)
            except OSError as exc:
                data, why = b"", f"recv: {exc.strerror}"
            else:
                why = "closed by the store"
            if not data:
                reasons.append(why)
                failed += 1
                sel.unregister(sock)
                continue
            got[fd] = got.get(fd, b"") + data
            if len(got[fd]) >= 8:
                took.append(time.monotonic() - started[fd])
                sel.unregister(sock)
    end = time.time()
    for sock in socks:
        sock.close()
    return {"took": took, "failed": count - len(took), "end": end, "reasons": reasons}


def burst(port: int, clients: int, procs: int) -> dict[str, Any]:
    release = time.time() + 1.0
    share = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    runners = [
        subprocess.Popen([sys.executable, __file__, "--client", str(port), str(n), repr(release)],
                         stdout=subprocess.PIPE, text=True)
        for n in share
    ]
    results = [json.loads(p.communicate()[0]) for p in runners]
    took = sorted(t for r in results for t in r["took"])
    return {
        "wall": max(r["end"] for r in results) - release,
        "median": statistics.median(took) if took else float("nan"),
        "p99": took[int(len(took) * 0.99) - 1] if took else float("nan"),
        "failed": float(sum(r["failed"] for r in results)),
        "reasons": sorted({why for r in results for why in r["reasons"]}),
    }


def latency(port: int, times: int) -> float:
    took = []
    for _ in range(times):
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(REQUEST)
            data = b""
            while len(data) < 8:
                more = sock.recv(8 - len(data))
                if not more:
                    raise RuntimeError("the store closed the connection")
                data += more
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def span(values: list[float], scale: float, unit: str) -> str:
    unit = f" {unit}" if unit else ""
    return f"{statistics.median(values) * scale:.0f}{unit} ({min(values) * scale:.0f}-{max(values) * scale:.0f})"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
            f"open files {nofile[0]}/{nofile[1]}, somaxconn {Path('/proc/sys/net/core/somaxconn').read_text().strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8192)
    parser.add_argument("--procs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=int, default=1000)
    args = parser.parse_args()
    modes = ["open", "check"]
    rows: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    for n in range(args.rounds):
        for mode in modes[n % 2:] + modes[: n % 2]:
            server, port = start_server(mode)
            try:
                result = burst(port, args.clients, args.procs)
                result["latency"] = latency(port, args.latency)
            finally:
                server.kill()
                server.wait()
            for key, value in result.items():
                if key != "reasons":
                    rows[mode].setdefault(key, []).append(value)
            print(f"round {n} {mode}: {result}", file=sys.stderr, flush=True)
    print(f"Machine: {machine()}\n")
    print(f"`python3 benchmarks/bench_store.py --clients {args.clients} --procs {args.procs} --rounds {args.rounds} "
          f"--latency {args.latency}`; median (min-max) of {args.rounds} rounds\n")
    print("| measure | without the check | with the check |")
    print("|---|---|---|")
    print(f"| {args.clients} clients at once, release → last answer | {span(rows['open']['wall'], 1e3, 'ms')} | "
          f"{span(rows['check']['wall'], 1e3, 'ms')} |")
    print(f"| ... one client's connect → answer, median | {span(rows['open']['median'], 1e3, 'ms')} | "
          f"{span(rows['check']['median'], 1e3, 'ms')} |")
    print(f"| ... 99th percentile | {span(rows['open']['p99'], 1e3, 'ms')} | {span(rows['check']['p99'], 1e3, 'ms')} |")
    print(f"| ... clients without an answer | {span(rows['open']['failed'], 1, '')} | "
          f"{span(rows['check']['failed'], 1, '')} |")
    print(f"| connect → first answer, one client, median of {args.latency} | "
          f"{span(rows['open']['latency'], 1e6, 'µs')} | {span(rows['check']['latency'], 1e6, 'µs')} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        print(json.dumps(burst_client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))))
    else:
        main()
