"""ddpboot's store server against torch's libuv TCPStore server, with the same clients doing what a rank's init does.

    python3 benchmarks/bench_store_scale.py --clients 1024,4096,8192,16384 --rounds 3

For each client count and round, each server is started fresh in its own process (the order alternates by round):

- `ddpboot`: `StoreServer` on sockets bound as the launcher binds them for that many ranks on one node
  (tcpstore/address.py: one socket, or a SO_REUSEPORT group where one listen queue cannot hold them all), the
  owner check on, as a job runs it (`--servers ddpboot-open` adds it without the check, `ddpboot-one` on one
  socket whatever the count, as before the groups);
- `torch`: `torch.distributed.TCPStore(host, port, is_master=True, use_libuv=True, wait_for_workers=False,
  master_listen_fd=FD)` on a socket bound the same way (what `ddpboot --store torch` runs);
- `torch-any` (only when asked for): the same, but torch binds port 0 itself, on "::" as torchrun's store does. Its
  server then sees IPv4 clients as mapped IPv6 addresses (::ffff:127.0.0.1), and the reverse lookup it makes of
  every client's address as it accepts it (getnameinfo, in its one event-loop thread) goes to DNS: where a DNS
  query is lost, every connection behind it waits for the resolver's retry (5 s).

Then `--procs` client processes (default: one per CPU), released together, open the clients' connections at once
(non-blocking connects) and each connection walks init's store traffic in torch's wire protocol
(ddpboot/tcpstore/protocol.py): VALIDATE and a PING (torch's client checks the server this way), ADD "init/" 1
(TCPStore's worker count), SET its rank's address key, WAIT for its neighbour's key and GET it (gloo's and NCCL's
address exchange), then ADD to a barrier key and WAIT for the barrier's last arrival to SET "done" (a store-based
barrier). Measured: release → last client done (wall), the slowest client's and the median client's own
connect → done time, and the server process's CPU seconds (user + system: on a machine whose cores the
clients also need, the steadier measure of the server's own cost), and the kernel's count of connections the
listen queue could not take during the round (TcpExt ListenOverflows, for the whole host): a connection dropped
there costs its client a retransmission, a second or more, so rounds with and without overflows differ by about
that. Clients not done `--client-timeout` seconds after the release count as failed (one failed client holds every
other at the barrier). Nothing is asserted on the times (the exit status is 1 when a client got no answer); the
Markdown table goes to stdout (benchmarks/RESULTS.md keeps the runs).
Every process raises its soft open-file limit to the hard limit; a count the hard limit cannot hold is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import SERVER, machine

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
VALUE = b"x" * 64  # about what gloo publishes per rank (its address)

DDPBOOT_SERVER = SERVER  # bench_store's server script: argv[1] 'check' keeps the owner check on

TORCH_SERVER = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
import torch.distributed as dist
if sys.argv[1] == "torch":  # on a socket bound as ddpboot binds it (what `--store torch` serves on)
    from ddpboot.tcpstore.address import bind_store_socket
    listener = bind_store_socket("127.0.0.1", None)
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, use_libuv=True, wait_for_workers=False,
                          master_listen_fd=listener.fileno())
else:  # torch-any: torch binds the port itself, on "::" (every address, IPv4 as mapped IPv6), as torchrun's does
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False)
print(store.port, flush=True)
while True:
    time.sleep(3600)
"""


def _vec(data: bytes) -> bytes:
    return struct.pack("=Q", len(data)) + data


def _keys(*keys: bytes) -> bytes:
    return struct.pack("=Q", len(keys)) + b"".join(_vec(k) for k in keys)


def steps(rank: int, world: int) -> list[tuple[bytes, int]]:
    """One client's requests as (bytes sent, bytes of the answer awaited) in torch's wire protocol; the barrier's
    last arrival is handled by the caller (its ADD answers `world`)."""
    peer = (rank + 1) % world
    return [
        (struct.pack("=BI", 0, 0x3C85F7CE) + struct.pack("=BI", 13, rank), 4),  # VALIDATE, PING → u32
        (b"\x04" + _vec(b"init/") + struct.pack("=q", 1), 8),  # ADD → i64
        (b"\x01" + _vec(f"/pg/rank_{rank}".encode()) + _vec(VALUE) + b"\x06" + _keys(f"/pg/rank_{peer}".encode()),
         1),  # SET, WAIT → STOP_WAITING
        (b"\x03" + _vec(f"/pg/rank_{peer}".encode()), 8 + len(VALUE)),  # GET → vec
        (b"\x04" + _vec(b"/pg/barrier") + struct.pack("=q", 1), 8),  # ADD → i64
        (b"\x06" + _keys(b"/pg/done"), 1),  # WAIT → STOP_WAITING
    ]


DONE = b"\x01" + _vec(b"/pg/done") + _vec(b"1")


class Client:
    def __init__(self, sock: socket.socket, rank: int, world: int) -> None:
        self.sock, self.world = sock, world
        self.todo = steps(rank, world)
        self.step = 0
        self.got = b""
        self.start = time.monotonic()

    def send_step(self) -> None:
        self.sock.sendall(self.todo[self.step][0])  # small: fits the socket's buffer

    def received(self, data: bytes) -> bool:
        """Take answer bytes; True when this client is done."""
        self.got += data
        need = self.todo[self.step][1]
        if len(self.got) < need:
            return False
        answer, self.got = self.got[:need], self.got[need:]
        if self.step == 4 and struct.unpack("=q", answer)[0] == self.world:
            self.sock.sendall(DONE)  # the barrier's last arrival releases everyone
        self.step += 1
        if self.step == len(self.todo):
            return True
        self.send_step()
        return False


def run_clients(port: int, first: int, count: int, world: int, release: float, timeout: float) -> dict[str, Any]:
    """Clients first..first+count-1 of `world`, connecting at `release` (a time.time() instant); `timeout`
    seconds after it, the clients not done are counted as failed (one client that fails keeps every other from
    passing the barrier)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    while time.time() < release:
        time.sleep(min(0.001, max(release - time.time(), 0)))
    sel = selectors.DefaultSelector()
    clients: dict[int, Client] = {}
    for rank in range(first, first + count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = Client(sock, rank, world)
        sock.connect_ex(("127.0.0.1", port))
        clients[sock.fileno()] = client
        sel.register(sock, selectors.EVENT_WRITE)
    took: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    while len(took) + len(errors) < count and time.monotonic() < deadline:
        for key, events in sel.select(1.0):
            client = clients[key.fd]
            try:
                if events & selectors.EVENT_WRITE:
                    error = client.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        raise OSError(error, f"connect: {os.strerror(error)}")
                    client.send_step()
                    sel.modify(client.sock, selectors.EVENT_READ)
                    continue
                data = client.sock.recv(4096)
                if not data:
                    raise OSError("closed by the store")
                if client.received(data):
                    took.append(time.monotonic() - client.start)
                    sel.unregister(client.sock)
            except OSError as exc:
                errors.append(str(exc))
                sel.unregister(client.sock)
    end = time.time()
    for client in clients.values():
        client.sock.close()
    return {"took": took, "errors": errors, "unfinished": count - len(took) - len(errors), "end": end}


def listeners_for(kind: str, clients: int) -> int:
    """The listening sockets a launcher gives ddpboot's store for `clients` ranks on one node (a SO_REUSEPORT group
    where one listen queue cannot hold them: launch/preflight.py); `ddpboot-one`: always one."""
    if kind.startswith("torch") or kind == "ddpboot-one":
        return 1
    from ddpboot.launch.preflight import listen_queue

    return listen_queue(clients, 1).sockets


def start_server(kind: str, clients: int) -> tuple[subprocess.Popen[str], int]:
    code = TORCH_SERVER if kind.startswith("torch") else DDPBOOT_SERVER
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mode = kind if kind.startswith("torch") else "open" if kind == "ddpboot-open" else "check"
    proc = subprocess.Popen([sys.executable, "-c", code, mode, str(listeners_for(kind, clients))],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def listen_counters() -> dict[str, int]:
    """The kernel's TcpExt counters of connections a listen queue could not take (/proc/net/netstat):
    ListenOverflows (a full accept queue: the handshake's last ACK is dropped, the client retransmits),
    ListenDrops (every drop at a listener) and SyncookiesSent (a full SYN queue)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    names, values = next((lines[i].split(), lines[i + 1].split()) for i in range(0, len(lines), 2)
                         if lines[i].startswith("TcpExt:"))
    table = dict(zip(names[1:], (int(v) for v in values[1:]), strict=True))
    return {k: table.get(k, 0) for k in ("ListenOverflows", "ListenDrops", "SyncookiesSent")}


def one_round(kind: str, clients: int, procs: int, timeout: float) -> dict[str, Any]:
    server, port = start_server(kind, clients)
    try:
        cpu_before = server_cpu(server.pid)  # its start (torch's import) left out
        counters_before = listen_counters()
        release = time.time() + 1.0 + clients / 8192
        share = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        firsts = [sum(share[:i]) for i in range(procs)]
        runners = [subprocess.Popen([sys.executable, __file__, "--client", str(port), str(first), str(n),
                                     str(clients), repr(release), repr(timeout)], stdout=subprocess.PIPE,
                                    text=True)
                   for first, n in zip(firsts, share, strict=True)]
        results = [json.loads(p.communicate()[0]) for p in runners]
        cpu = server_cpu(server.pid) - cpu_before
        counters = {k: v - counters_before[k] for k, v in listen_counters().items()}
    finally:
        server.kill()
        server.wait()
    took = sorted(t for r in results for t in r["took"])
    errors = sorted({e for r in results for e in r["errors"]})
    return {
        "wall": max(r["end"] for r in results) - release,
        "slowest": took[-1] if took else float("nan"),
        "median": statistics.median(took) if took else float("nan"),
        "failed": clients - len(took),
        "cpu": cpu,
        "overflows": counters["ListenOverflows"],
        "syncookies": counters["SyncookiesSent"],
        "errors": errors[:3],
        "listeners": listeners_for(kind, clients),
    }


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:,.0f} ms ({min(values) * 1e3:,.0f}–{max(values) * 1e3:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1024,4096,8192,16384", help="client counts, comma-separated")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="client processes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="ddpboot,torch",
                        help="ddpboot, torch, ddpboot-open (no owner check), ddpboot-one (one listening socket "
                             "whatever the count), torch-any")
    parser.add_argument("--client-timeout", type=float, default=60.0,
                        help="seconds after the release at which clients not done count as failed (default 60)")
    args = parser.parse_args()
    kinds = args.servers.split(",")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        if hard != resource.RLIM_INFINITY and clients + 256 > hard:
            print(f"skipped {clients} clients: the hard open-file limit is {hard}", file=sys.stderr)
            continue
        got: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
        for n in range(args.rounds):
            for kind in kinds[n % len(kinds):] + kinds[: n % len(kinds)]:
                result = one_round(kind, clients, args.procs, args.client_timeout)
                print(f"{clients} clients, round {n}, {kind}: {result}", file=sys.stderr, flush=True)
                for key in ("wall", "slowest", "median", "failed", "cpu", "overflows"):
                    got[kind].setdefault(key, []).append(result[key])
        rows.append((clients, got))
    print(f"Machine: {machine()}\n")
    print(f"`python3 benchmarks/bench_store_scale.py --clients {args.clients} --procs {args.procs} "
          f"--rounds {args.rounds} --servers {args.servers}`; median (min–max) of {args.rounds} rounds\n")
    ratio_of = kinds[0] if "torch" in kinds and kinds[0] != "torch" else None
    print("| clients | server | slowest client | median client | release → all done | server CPU | accept-queue "
          "overflows | failed |")
    print("|---|---|---|---|---|---|---|---|")
    for clients, got in rows:
        for k in kinds:
            print(f"| {clients:,} | {k} | {ms(got[k]['slowest'])} | {ms(got[k]['median'])} | {ms(got[k]['wall'])} | "
                  f"{ms(got[k]['cpu'])} | {', '.join(f'{o:,}' for o in got[k]['overflows'])} | "
                  f"{max(got[k]['failed']):.0f} |")
        if ratio_of:
            ratio = {m: statistics.median(got[ratio_of][m]) / statistics.median(got["torch"][m]) for m in
                     ("slowest", "median", "wall", "cpu")}
            print(f"| {clients:,} | {ratio_of}/torch | {ratio['slowest']:.2f}× | {ratio['median']:.2f}× | "
                  f"{ratio['wall']:.2f}× | {ratio['cpu']:.2f}× | | |")
    if any(max(got[k]["failed"]) for _, got in rows for k in kinds):
        sys.exit("bench_store_scale: some clients got no answer (the table's last column; the log names why)")


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--client":
        port, first, count, world = (int(a) for a in sys.argv[2:6])
        print(json.dumps(run_clients(port, first, count, world, float(sys.argv[6]), float(sys.argv[7]))))
    else:
        main()
