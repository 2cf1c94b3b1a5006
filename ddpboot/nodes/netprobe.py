"""The network check's I/O at the nodes' check-in (nodes/check.py runs it, nodes/network.py decides): this node's
interfaces (getifaddrs, in its order), what its host name resolves to and which of that it can bind, the listeners
the other nodes connect to, the connections to theirs, and the results, exchanged through node 0's store.

Each node listens for the check on its bootstrap addresses and every other address of its interfaces (port 0: a
free one), and answers each connection with its token, a random string it published; a connection that brings
back another token (an address two hosts share, docker0's 172.17.0.1, 127.0.0.1, where this node's own listener
answered) does not count, one still silent when the probe's time is up does (the kernel made it; a loaded node
may accept late). Round 1 connects to every other node's bootstrap address; only
when some node was not reached does round 2 connect to that node's other addresses (the interface to suggest).
Listeners are closed when the check ends; they accept nothing but these connections, which carry nothing.

What it costs (docs/clusters.md has the measurements): per node one SET and one MULTI_GET of every node's report
(a few hundred bytes each), one connection to and from every other node, one SET of its results, one WAIT for
every node's (its answer comes in the same select as the connections), one CHECK per node and one MULTI_GET of
them; 2 s at most for an address that does not answer.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import ipaddress
import json
import os
import select
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ddpboot.nodes.network import Choice, Iface, NodeNet, candidates, gloo_choice, nccl_choice, problems, unreached
from ddpboot.tcpstore.address import LOOPBACK_NAMES
from ddpboot.tcpstore.client import StoreClient, StoreTimeout

PROBE_TIMEOUT = 2.0  # seconds a connection to another node's address gets
RESULTS_WAIT = 15.0  # seconds a node waits for the other nodes' results of one round
POLL = 0.1  # seconds at most between two looks at the probe's deadline and the stop signals
HOSTS_FILE = Path("/etc/hosts")
Targets = list[tuple[int, int, str, int, str]]  # (node, endpoint index, address, port, its token)


class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.POINTER(_Sockaddr)),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def interfaces() -> list[Iface]:
    """Every IPv4 and IPv6 address of this node's interfaces, in getifaddrs' order (the one NCCL walks)."""
    libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter has loaded
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return []
    out = []
    try:
        node = head
        while node:
            entry = node.contents
            if entry.addr:
                family = entry.addr.contents.family
                raw = bytes(entry.addr.contents.data)
                name = (entry.name or b"").decode(errors="replace")
                if family == socket.AF_INET:
                    out.append(Iface(name, socket.inet_ntop(socket.AF_INET, raw[2:6])))
                elif family == socket.AF_INET6:
                    out.append(Iface(name, socket.inet_ntop(socket.AF_INET6, raw[6:22]), v6=True))
            node = entry.next
    finally:
        libc.freeifaddrs(head)
    return out


def resolve(name: str, timeout: float = 5.0) -> list[str]:
    """The addresses `name` resolves to, in order; none when it does not within `timeout` (a lookup can hang)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(socket.getaddrinfo, name, None, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout)
        pool.shutdown(wait=True)  # the launcher forks workers later, which it does only without threads
    except (concurrent.futures.TimeoutError, OSError):
        pool.shutdown(wait=False)
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def bindable(addrs: Iterable[str]) -> list[str]:
    """The addresses this node can bind, in order (torch's test for gloo's host name)."""
    out = []
    for addr in addrs:
        with contextlib.suppress(OSError), socket.socket(_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
            out.append(addr)
    return out


def hosts_file_maps(name: str, addr: str, path: Path = HOSTS_FILE) -> bool:
    """Whether /etc/hosts maps `name` to `addr` (where a name that resolves to loopback usually comes from)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return False
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) > 1 and words[0] == addr and name in words[1:]:
            return True
    return False


def store_name_note(master_addr: str) -> str | None:
    """Node 0's store address given as a name that resolves to loopback here: the other hosts cannot reach it."""
    if master_addr.lower() in LOOPBACK_NAMES or _is_ip(master_addr):
        return None
    addrs = resolve(master_addr)
    if not addrs or not ipaddress.ip_address(addrs[0].split("%")[0]).is_loopback:
        return None
    where = " (from /etc/hosts)" if hosts_file_maps(master_addr, addrs[0]) else ""
    return (f"MASTER_ADDR {master_addr} resolves to {addrs[0]} on node 0{where}, not an address the other nodes can "
            "reach: node 0's store listens there, where only launchers of its own host connect. Give --master-addr "
            "node 0's address on the other nodes' network")


class NetCheck:
    """One node's part of the network check: made before the node checks in (its listeners bound), published with
    its check-in entry, run once every node has checked in, closed at the end."""

    def __init__(self, node: int, nnodes: int, backend: str, env: Mapping[str, str], host: str | None = None) -> None:
        """For the plan's `backend`: nccl (GPU ranks) checks NCCL's bootstrap address, any other gloo's."""
        self.node, self.nnodes = node, nnodes
        self.lib = "NCCL" if backend == "nccl" else "gloo"
        self.prefix = ""  # the check-in's keys (nodes/check.py gives them, publish)
        self.host = host or socket.gethostname()
        ifaces = interfaces()
        name = socket.gethostname()
        resolved = bindable(resolve(name))
        source = "/etc/hosts" if resolved and hosts_file_maps(name, resolved[0]) else ""
        self.choices: dict[str, Choice | None] = {"NCCL": nccl_choice(ifaces, env),
                                                  "gloo": gloo_choice(ifaces, env, name, resolved, source)}
        self.token = os.urandom(8).hex()
        self.listeners: list[socket.socket] = []
        self.listen: list[tuple[str, str, int]] = []
        wanted = [(c.iface, c.addr) for c in self.choices.values() if c is not None]
        wanted += [(i.name, i.addr) for i in candidates(ifaces)]
        for iface, addr in dict.fromkeys(wanted):
            if addr in (a for _, a, _ in self.listen):
                continue
            with contextlib.suppress(OSError):
                sock = socket.socket(_family(addr), socket.SOCK_STREAM)
                try:
                    sock.bind((addr, 0))
                    sock.listen(max(4 * nnodes, 64))
                except OSError:
                    sock.close()
                    raise
                sock.setblocking(False)
                self.listeners.append(sock)
                self.listen.append((iface, addr, int(sock.getsockname()[1])))

    def report(self) -> str:
        return json.dumps({"host": self.host, "token": self.token, "listen": self.listen,
                           "choices": {k: None if c is None else c.to_json() for k, c in self.choices.items()}})

    def publish(self, client: StoreClient, prefix: str) -> None:
        """This node's report, under the check-in's `prefix` (its other keys go there too)."""
        self.prefix = prefix
        client.set(f"{self.prefix}/{self.node}/net", self.report())

    def run(self, client: StoreClient, tick: Callable[[], None] | None = None) -> list[str]:
        """Both rounds; the problems found, the same on every node."""
        raw = client.multi_get([f"{self.prefix}/{r}/net" for r in range(self.nnodes)])
        reports = {r: json.loads(v) for r, v in enumerate(raw)}
        nodes = {r: NodeNet(str(d["host"]), {k: Choice.from_json(c) for k, c in d["choices"].items()},
                            [(str(i), str(a), int(p)) for i, a, p in d["listen"]]) for r, d in reports.items()}
        tokens = {r: str(d["token"]) for r, d in reports.items()}
        first: Targets = []
        for b, net in nodes.items():
            choice = net.choices.get(self.lib)
            index = None if b == self.node or choice is None else net.endpoint(choice.addr)
            if index is not None:
                first.append((b, index, choice.addr, net.listen[index][2], tokens[b]))  # type: ignore[union-attr]
        reached = self._round(client, "reach1", first, tick)
        missing = unreached(nodes, reached, self.lib)
        if missing:
            second = [(b, i, a, p, tokens[b]) for b in missing if b != self.node
                      for i, (_, a, p) in enumerate(nodes[b].listen)]
            more = self._round(client, "reach2", second, tick)
            for a, seen in more.items():
                for b, indexes in seen.items():
                    reached.setdefault(a, {}).setdefault(b, set()).update(indexes)
        return problems(nodes, self.lib, missing, reached)

    def close(self) -> None:
        for sock in self.listeners:
            sock.close()
        self.listeners = []

    def _round(self, client: StoreClient, kind: str, targets: Targets, tick: Callable[[], None] | None
               ) -> dict[int, dict[int, set[int]]]:
        """Connect to `targets` while answering the others, publish what this node reached, and wait (answering
        still: the store's answer to the wait arrives in the same select) for every node's; their results."""
        keys = [f"{self.prefix}/{r}/{kind}" for r in range(self.nnodes)]
        probe = _Probe(self.listeners, targets, self.token)
        waiting = False
        try:
            while True:
                if not waiting and not probe.probing:
                    client.set(keys[self.node], json.dumps({str(b): sorted(i) for b, i in probe.reached.items()}))
                    client.begin_wait(keys)
                    waiting = True
                if tick is not None:
                    tick()
                left = probe.start + PROBE_TIMEOUT + RESULTS_WAIT - time.monotonic()
                if probe.step(client if waiting else None) or (waiting and left <= 0):
                    try:
                        client.end_wait(0.0 if left <= 0 else RESULTS_WAIT)
                        complete = True
                    except StoreTimeout:  # some node gave no results in time: the check goes on without them
                        complete = False
                    break
        finally:
            probe.close()
        present = list(range(self.nnodes)) if complete else [r for r, key in enumerate(keys) if client.check([key])]
        values = client.multi_get([keys[r] for r in present]) if present else []
        return {r: {int(b): set(i) for b, i in json.loads(v).items()} for r, v in zip(present, values, strict=True)}


class _Probe:
    """Connections to other nodes' listeners (PROBE_TIMEOUT at most), while this node answers theirs."""

    def __init__(self, listeners: list[socket.socket], targets: Targets, token: str) -> None:
        self.listeners, self.token = listeners, token
        self.start = time.monotonic()
        self.connecting: dict[socket.socket, tuple[int, int, str]] = {}
        self.reading: dict[socket.socket, tuple[int, int, str]] = {}
        self.reached: dict[int, set[int]] = {}
        for node, index, addr, port, their in targets:
            sock = socket.socket(_family(addr), socket.SOCK_STREAM)
            sock.setblocking(False)
            if sock.connect_ex((addr, port)) in (0, errno.EINPROGRESS):
                self.connecting[sock] = (node, index, their)
            else:
                sock.close()

    @property
    def probing(self) -> bool:
        if time.monotonic() - self.start >= PROBE_TIMEOUT:
            _give_up(self.connecting, self.reading, self.reached)
        return bool(self.connecting or self.reading)

    def step(self, client: StoreClient | None = None) -> bool:
        """One select over the listeners, the connections and the store's answer (`client` waiting): whether that
        answer arrived."""
        watched: list[Any] = [*self.listeners, *self.reading] + ([client] if client is not None else [])
        readable, writable, _ = select.select(watched, list(self.connecting), [], POLL)
        for sock in readable:
            if sock is client:
                continue
            if sock in self.listeners:
                _answer(sock, self.token)
            else:
                _read_token(sock, self.reading, self.reached)
        for sock in writable:
            target = self.connecting.pop(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                self.reading[sock] = target
            else:
                sock.close()
        if time.monotonic() - self.start >= PROBE_TIMEOUT:
            _give_up(self.connecting, self.reading, self.reached)
        return client is not None and client in readable

    def close(self) -> None:
        for sock in [*self.connecting, *self.reading]:
            sock.close()


def _give_up(connecting: dict[socket.socket, tuple[int, int, str]], reading: dict[socket.socket, tuple[int, int, str]],
             reached: dict[int, set[int]]) -> None:
    """The probe's time is up: a connection that was made counts as reaching its node even where the node has not
    answered yet (a loaded node accepts late: the kernel made the connection); one still being made does not."""
    for sock, (node, index, _) in reading.items():
        reached.setdefault(node, set()).add(index)
        sock.close()
    for sock in connecting:
        sock.close()
    connecting.clear()
    reading.clear()


def _answer(listener: socket.socket, token: str) -> None:
    with contextlib.suppress(OSError):
        conn, _ = listener.accept()
        with conn:
            conn.setblocking(True)
            conn.settimeout(0.5)
            conn.sendall(token.encode())


def _read_token(sock: socket.socket, reading: dict[socket.socket, tuple[int, int, str]],
                reached: dict[int, set[int]]) -> None:
    node, index, their = reading.pop(sock)
    with contextlib.suppress(OSError), sock:
        data = sock.recv(64)
        if data.decode(errors="replace") == their:
            reached.setdefault(node, set()).add(index)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True
