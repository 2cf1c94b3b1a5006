"""The network check at the nodes' check-in, with nodes that really cannot reach each other: two network namespaces
the test makes (`ip netns`), joined by a veth pair (vx0 10.250.0.1 in the first, vx1 10.250.0.2 in the second),
and in the second a veth pair of its own named like an InfiniBand port (ib0 10.251.0.2, its peer xpeer 10.251.0.3),
which routes nowhere: NCCL would take it (the first ib* interface) and the first node cannot reach it. Node 0's
launcher runs in the first namespace, node 1's in the second (`ip netns exec`), node 0's store on 10.250.0.1. No
address outside these namespaces is used. Root only (the tests skip, saying so, elsewhere).

The job is a script that writes a mark per rank and imports nothing: what is checked happens before any rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import clean_env, ddpboot_exe, finish, free_port

MARK = "import os, sys\nopen(os.path.join(os.environ['MARK_DIR'], 'rank' + os.environ['RANK']), 'w').close()\n"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module")
def namespaces() -> Iterator[tuple[str, str]]:
    if os.getuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("the network check's failures are built with network namespaces (ip netns, iproute2): root only")
    ns = (f"ddpnc0-{os.getpid()}", f"ddpnc1-{os.getpid()}")
    try:
        for name in ns:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", "vx0", "netns", ns[0], "type", "veth", "peer", "name", "vx1", "netns", ns[1])
        _ip("-n", ns[1], "link", "add", "ib0", "type", "veth", "peer", "name", "xpeer")
        for name, dev, addr in ((ns[0], "vx0", "10.250.0.1/24"), (ns[1], "ib0", "10.251.0.2/24"),
                                (ns[1], "xpeer", "10.251.0.3/24"), (ns[1], "vx1", "10.250.0.2/24")):
            _ip("-n", name, "addr", "add", addr, "dev", dev)
            _ip("-n", name, "link", "set", dev, "up")
        yield ns
    finally:
        for name in ns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def start_nodes(ns: tuple[str, str], tmp_path: Path, *extra: str, env: tuple[dict[str, str], ...] = ({}, {}),
                hosts: tuple[str, str] | None = None, addr: str = "10.250.0.1", join: int = 20
                ) -> list[subprocess.Popen[Any]]:
    """Node 0 in the first namespace, node 1 in the second, each with GPU locks of its own (as two hosts have);
    `hosts`: an /etc/hosts of its own for each (a mount namespace, `unshare -m`)."""
    (tmp_path / "mark.py").write_text(MARK)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        args = [*ddpboot_exe(), "--nnodes", "2", "--node-rank", str(rank), "--master-addr", addr, "--master-port",
                port, "--nproc", "1", "--rdzv-conf", f"join_timeout={join}", *extra, str(tmp_path / "mark.py")]
        if hosts is not None:
            (tmp_path / f"hosts{rank}").write_text(hosts[rank])
            args = ["unshare", "-m", "sh", "-c", f'mount --bind {tmp_path / f"hosts{rank}"} /etc/hosts && exec "$@"',
                    "sh", *args]
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns[rank], *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True,
                                      env=clean_env(MARK_DIR=str(tmp_path), **env[rank],
                                                    DDPBOOT_LOCK_DIR=str(_locks(tmp_path, rank)))))
    return procs


def _locks(tmp_path: Path, rank: int) -> Path:
    path = tmp_path / f"locks{rank}"
    path.mkdir(mode=0o1777, exist_ok=True)
    return path


def results(procs: list[subprocess.Popen[Any]]) -> list[tuple[int, str, str]]:
    return [finish(p, 90) for p in procs]


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ddpboot: error:")]


def test_nccl_over_an_interface_the_other_node_cannot_reach_is_one_error_naming_it(
        namespaces: tuple[str, str], tmp_path: Path) -> None:
    """GPU ranks (simulated GPUs: NCCL): node 1's NCCL would take ib0, which node 0 cannot reach; both nodes exit 2
    before any rank, naming node 1, ib0, its address and the variable to set (vx1: node 0 reached it)."""
    gpus = {"DDPBOOT_FAKE_GPUS": "1"}
    for code, out, err in results(start_nodes(namespaces, tmp_path, env=(gpus, gpus))):
        assert code == 2, out + err
        lines = errors(err)
        assert len(lines) == 1, err
        assert ("would hang, so no worker was started: node 1 (" in lines[0]
                and ") would bootstrap NCCL over ib0 (10.251.0.2; the first ib* interface; NCCL_SOCKET_IFNAME is not "
                    "set), which node 0 cannot reach; set NCCL_SOCKET_IFNAME=vx1" in lines[0]), err
    assert not list(tmp_path.glob("rank*"))


def test_the_variable_it_names_makes_the_job_run(namespaces: tuple[str, str], tmp_path: Path) -> None:
    """NCCL_SOCKET_IFNAME=vx (the prefix of vx0 and vx1): both nodes pass the check and run their rank."""
    gpus = {"DDPBOOT_FAKE_GPUS": "1", "NCCL_SOCKET_IFNAME": "vx"}
    for code, out, err in results(start_nodes(namespaces, tmp_path, env=(gpus, gpus))):
        assert code == 0, out + err
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]


def test_no_network_check_starts_the_job_unchecked(namespaces: tuple[str, str], tmp_path: Path) -> None:
    gpus = {"DDPBOOT_FAKE_GPUS": "1"}
    for code, out, err in results(start_nodes(namespaces, tmp_path, "--no-network-check", env=(gpus, gpus))):
        assert code == 0, out + err  # the ranks import no torch: nothing bootstraps, so nothing hangs here
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]


def test_gloo_over_a_host_name_that_resolves_to_loopback_is_named_on_both_nodes(
        namespaces: tuple[str, str], tmp_path: Path) -> None:
    """CPU ranks (gloo), the host's name resolving to 127.0.1.1 in each node's /etc/hosts (Debian's line): each
    node's gloo would bootstrap over loopback, which the other cannot reach."""
    name = os.uname().nodename
    hosts = (f"127.0.0.1 localhost\n127.0.1.1 {name}\n",) * 2
    for code, out, err in results(start_nodes(namespaces, tmp_path, "--cpu", hosts=hosts)):
        assert code == 2, out + err
        line = errors(err)[0]
        for node, other, iface in ((0, 1, "vx0"), (1, 0, "vx1")):
            assert (f"node {node} ({name}) would bootstrap gloo over lo (127.0.1.1; its host name {name} resolves "
                    f"to it, from /etc/hosts), which node {other} cannot reach; set GLOO_SOCKET_IFNAME={iface}"
                    in line), err


def test_a_store_name_that_resolves_to_loopback_on_node_0_only_is_named(
        namespaces: tuple[str, str], tmp_path: Path) -> None:
    """MASTER_ADDR `ddpboot-head`: 127.0.1.1 in node 0's /etc/hosts, 10.250.0.1 in node 1's. Node 0's store listens
    on loopback, node 1 cannot join; node 0 says why when the join timeout (4 s here) ends."""
    hosts = ("127.0.1.1 ddpboot-head\n", "10.250.0.1 ddpboot-head\n")
    (c0, o0, e0), (c1, o1, e1) = results(start_nodes(namespaces, tmp_path, "--cpu", hosts=hosts,
                                                     addr="ddpboot-head", join=4))
    assert (c0, c1) == (2, 2), o0 + e0 + o1 + e1
    assert ("MASTER_ADDR ddpboot-head resolves to 127.0.1.1 on node 0 (from /etc/hosts), not an address the other "
            "nodes can reach" in errors(e0)[0]), e0
    assert "no store answers at ddpboot-head" in errors(e1)[0], e1
