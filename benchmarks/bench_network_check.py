"""What the network check costs at the nodes' check-in: N processes on this machine, each one node's check-in
(ddpboot.nodes.check.check_nodes) against one ddpboot store, with the network check (ddpboot.nodes.netprobe) and
without it (`--no-network-check`), alternating.

    .venv/bin/python benchmarks/bench_network_check.py --nodes 2,8,16 --rounds 10

Measured per check-in, from the instant every node process is ready (a barrier) to its check-in's end: the slowest
node's time, median and min–max over the rounds, and the difference the check makes. Every node is on loopback, so
this is the check's own work (its listeners, the store round trips, one connection per pair of nodes), not a
network's latency; an address that does not answer adds at most the probe's 2 s per round. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import threading
import time

from ddpboot.nodes.check import check_nodes
from ddpboot.nodes.netprobe import NetCheck
from ddpboot.tcpstore.server import serve_forever


def node(rank: int, n: int, port: int, network: bool, start: multiprocessing.synchronize.Barrier,
         times: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    start.wait()
    t0 = time.perf_counter()
    check = NetCheck(rank, n, "gloo", {"GLOO_SOCKET_IFNAME": "lo"}) if network else None
    check_nodes("127.0.0.1", port, n, rank, 1, timeout=60, host=f"n{rank}", network=check)
    times.put(time.perf_counter() - t0)


def one(n: int, network: bool) -> float:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    threading.Thread(target=serve_forever, args=(listener,), daemon=True).start()
    ctx = multiprocessing.get_context("fork")
    start, times = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=node, args=(r, n, listener.getsockname()[1], network, start, times))
             for r in range(n)]
    for p in procs:
        p.start()
    took = [times.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    return max(took)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,8")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print("| nodes | check-in without the check (ms) | with it (ms) | the check costs (ms) |")
    print("|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        runs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for network in ((False, True) if r % 2 else (True, False)):
                runs[network].append(one(n, network) * 1000)
        off, on = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"| {n} | {off:.1f} ({min(runs[False]):.1f}–{max(runs[False]):.1f}) | {on:.1f} "
              f"({min(runs[True]):.1f}–{max(runs[True]):.1f}) | {on - off:.1f} |")


if __name__ == "__main__":
    main()
