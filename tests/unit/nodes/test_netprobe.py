"""The network check's I/O (ddpboot/nodes/netprobe.py) on this machine: its interfaces, name lookups, and the check
itself run by three nodes' check-ins against a real store. Nodes that cannot reach each other are built with
network namespaces in tests/process/test_network_check.py."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.nodes.check import check_nodes
from ddpboot.nodes.netprobe import NetCheck, bindable, hosts_file_maps, interfaces, resolve, store_name_note
from ddpboot.tcpstore.server import serve_forever


def test_this_machines_interfaces_and_names() -> None:
    found = interfaces()
    assert ("lo", "127.0.0.1") in [(i.name, i.addr) for i in found]
    assert [i.v6 for i in found] == sorted(i.v6 for i in found)  # getifaddrs gives IPv4 first
    assert "127.0.0.1" in resolve("localhost")
    assert resolve("no-such-host.invalid") == []
    assert bindable(["127.0.0.1", "192.0.2.254", "127.0.0.9"]) == ["127.0.0.1", "127.0.0.9"]


def test_the_hosts_file_says_where_a_name_resolves(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.1.1 gpu07.cluster gpu07  # Debian's own line\n# 10.0.0.7 gpu07\n")
    assert hosts_file_maps("gpu07", "127.0.1.1", hosts) and not hosts_file_maps("gpu07", "10.0.0.7", hosts)
    assert not hosts_file_maps("gpu07", "127.0.1.1", tmp_path / "none")
    assert store_name_note("localhost") is None and store_name_note("10.0.0.7") is None


def check_all(port: int, n: int, network: bool, env: dict[str, str]) -> tuple[list[str], float]:
    """Every node's check-in in a thread; each outcome ("ok" or its error) and the seconds it took."""
    out = [""] * n

    def node(i: int) -> None:
        try:
            check = NetCheck(i, n, "gloo", env, host=f"h{i}") if network else None
            check_nodes("127.0.0.1", port, n, i, 1, timeout=30, host=f"h{i}", network=check)
            out[i] = "ok"
        except UsageError as exc:
            out[i] = str(exc)

    t0 = time.monotonic()
    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, time.monotonic() - t0


def test_nodes_that_reach_each_other_pass_the_check(store_port: int) -> None:
    out, took = check_all(store_port, 3, True, {"GLOO_SOCKET_IFNAME": "lo"})
    print(f"check-in of 3 nodes with the network check: {took * 1000:.0f} ms")
    assert out == ["ok", "ok", "ok"]


def test_a_node_whose_bootstrap_address_refuses_is_named(store_port: int) -> None:
    """Node 1's gloo address answers nothing (its listener there is closed before the others connect, as an
    address whose port a firewall rejects): every node says so, naming node 1's interface and address."""
    n = 2
    out = [""] * n
    checks = [NetCheck(i, n, "gloo", {"GLOO_SOCKET_IFNAME": "lo"}, host=f"h{i}") for i in range(n)]
    refusing = next(s for s in checks[1].listeners if s.getsockname()[0] == "127.0.0.1")
    checks[1].listeners.remove(refusing)
    refusing.close()

    def node(i: int) -> None:
        try:
            check_nodes("127.0.0.1", store_port, n, i, 1, timeout=30, host=f"h{i}", network=checks[i])
            out[i] = "ok"
        except UsageError as exc:
            out[i] = str(exc)

    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for msg in out:
        assert msg.startswith("the network check found that init_process_group would hang"), out
        assert "node 1 (h1) would bootstrap gloo over lo (127.0.0.1; GLOO_SOCKET_IFNAME=lo), which node 0 cannot " \
               "reach" in msg, out
    assert all(s.fileno() == -1 for c in checks for s in c.listeners)  # closed at the end


def test_the_cost_of_the_check(store_port: int) -> None:
    """Two nodes on loopback, each check-in 5 times with and without the check: the added time, printed."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(5):
        for network in (False, True):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            threading.Thread(target=serve_forever, args=(listener,), daemon=True).start()
            out, took = check_all(int(listener.getsockname()[1]), 2, network, {"GLOO_SOCKET_IFNAME": "lo"})
            assert out == ["ok", "ok"]
            times[network].append(took)
    with_check, without = sorted(times[True])[2], sorted(times[False])[2]
    print(f"2-node check-in: {without * 1000:.1f} ms without the network check, {with_check * 1000:.1f} ms with it "
          "(medians of 5)")
    assert with_check < without + 1.0
