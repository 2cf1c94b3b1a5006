"""The network check's decisions (ddpboot/nodes/network.py): NCCL's and gloo's bootstrap address on a node, as their
sources pick them, and the messages when another node cannot reach it."""

from __future__ import annotations

import pytest

from ddpboot.nodes.network import (
    Choice,
    Iface,
    NodeNet,
    candidates,
    gloo_choice,
    interface_of,
    nccl_choice,
    node_list,
    problems,
    unreached,
)

# getifaddrs' order on a GPU node with docker: IPv4 addresses first, by interface index, then IPv6
NODE = [Iface("lo", "127.0.0.1"), Iface("eno1", "10.0.0.7"), Iface("docker0", "172.17.0.1"),
        Iface("ib0", "192.168.1.7"), Iface("ib1", "192.168.2.7"), Iface("lo", "::1", True),
        Iface("eno1", "fd00::7", True), Iface("eno1", "fe80::7", True)]


@pytest.mark.parametrize(("env", "iface", "why"), [
    ({}, "ib0", "the first ib* interface; NCCL_SOCKET_IFNAME is not set"),
    ({"NCCL_SOCKET_IFNAME": "eno"}, "eno1", "NCCL_SOCKET_IFNAME=eno"),
    ({"NCCL_SOCKET_IFNAME": "=ib1"}, "ib1", "NCCL_SOCKET_IFNAME==ib1"),
    ({"NCCL_SOCKET_IFNAME": "^lo,eno,ib"}, "docker0", "NCCL_SOCKET_IFNAME=^lo,eno,ib"),
    ({"NCCL_SOCKET_IFNAME": "ib1:5000,eno1"}, "eno1", "NCCL_SOCKET_IFNAME=ib1:5000,eno1"),  # the first in order
    ({"NCCL_SOCKET_IFNAME": "e"}, "ib0", "the first ib* interface; NCCL_SOCKET_IFNAME is not set"),  # 1 char: unset
])
def test_nccls_interface_is_the_one_its_source_picks(env: dict[str, str], iface: str, why: str) -> None:
    choice = nccl_choice(NODE, env)
    assert choice is not None and (choice.iface, choice.why) == (iface, why)


def test_without_ib_nccl_takes_the_first_that_is_not_docker_or_lo_then_docker_then_lo() -> None:
    plain = [i for i in NODE if not i.name.startswith("ib")]
    assert nccl_choice(plain, {}) == Choice("NCCL", "eno1", "10.0.0.7", "the first that is neither docker* nor lo; "
                                            "NCCL_SOCKET_IFNAME is not set")
    assert nccl_choice(plain, {"NCCL_SOCKET_FAMILY": "AF_INET6"}).addr == "fd00::7"  # type: ignore[union-attr]
    docker = [i for i in plain if i.name != "eno1"]
    assert nccl_choice(docker, {}).iface == "docker0"  # type: ignore[union-attr]
    assert nccl_choice([NODE[0], NODE[5]], {}) == Choice("NCCL", "lo", "127.0.0.1", "no interface but lo; "
                                                         "NCCL_SOCKET_IFNAME is not set")
    assert nccl_choice([NODE[5]], {}) is None  # IPv6 loopback never
    assert nccl_choice(NODE, {"NCCL_SOCKET_IFNAME": "eth"}) is None  # names nothing here: NCCL fails


def test_gloos_address_is_its_interface_or_the_host_names_first_bindable_address_or_loopback() -> None:
    assert gloo_choice(NODE, {"GLOO_SOCKET_IFNAME": "ib1,eno1"}, "gpu07", []) == Choice(
        "gloo", "ib1", "192.168.2.7", "GLOO_SOCKET_IFNAME=ib1,eno1")
    assert gloo_choice(NODE, {"GLOO_SOCKET_IFNAME": "eth0"}, "gpu07", []) is None
    debian = gloo_choice(NODE, {}, "gpu07", ["127.0.1.1"], "/etc/hosts")
    assert debian == Choice("gloo", "lo", "127.0.1.1", "its host name gpu07 resolves to it, from /etc/hosts")
    assert gloo_choice(NODE, {}, "gpu07", ["10.0.0.7"]).iface == "eno1"  # type: ignore[union-attr]
    assert gloo_choice(NODE, {}, "gpu07", []) == Choice("gloo", "lo", "127.0.0.1", "its host name gpu07 resolves "
                                                        "to no address of this node")
    assert interface_of(NODE, "10.9.9.9") == ""


def test_the_other_addresses_probed_are_each_interfaces_first_reachable_one() -> None:
    assert [(i.name, i.addr) for i in candidates(NODE)] == [
        ("eno1", "10.0.0.7"), ("docker0", "172.17.0.1"), ("ib0", "192.168.1.7"), ("ib1", "192.168.2.7")]


def net(host: str, choice: Choice | None, *listen: tuple[str, str]) -> NodeNet:
    return NodeNet(host, {"NCCL": choice}, [(name, addr, 40000 + i) for i, (name, addr) in enumerate(listen)])


def test_a_node_the_others_cannot_reach_is_named_with_an_interface_they_reached() -> None:
    docker = Choice("NCCL", "docker0", "172.17.0.1", "the first that is neither docker* nor lo; NCCL_SOCKET_IFNAME "
                    "is not set")
    nodes = {r: net(f"gpu0{r}", Choice("NCCL", "ib0", f"192.168.1.{r}", "the first ib* interface"),
                    ("ib0", f"192.168.1.{r}")) for r in range(3)}
    nodes[3] = net("gpu03", docker, ("docker0", "172.17.0.1"), ("eno1", "10.0.0.3"), ("ib0", "192.168.1.3"))
    # everyone reaches nodes 0-2; node 3's docker0 and eno1 nobody (round 1: docker0; round 2: all three)
    reached = {a: {b: {0} for b in range(3) if b != a} | ({3: {2}} if a != 3 else {}) for a in range(4)}
    missing = unreached(nodes, {a: {b: i & {0} if b == 3 else i for b, i in seen.items()}
                                for a, seen in reached.items()}, "NCCL")
    assert missing == {3: [0, 1, 2]}
    assert problems(nodes, "NCCL", missing, reached) == [
        "node 3 (gpu03) would bootstrap NCCL over docker0 (172.17.0.1; the first that is neither docker* nor lo; "
        "NCCL_SOCKET_IFNAME is not set), which nodes 0-2 cannot reach; set NCCL_SOCKET_IFNAME=ib0"]


def test_no_reachable_interface_and_no_interface_at_all_are_said_too() -> None:
    nodes = {0: net("a", Choice("NCCL", "eno1", "10.0.0.1", "x"), ("eno1", "10.0.0.1")),
             1: net("b", Choice("NCCL", "eno1", "10.0.0.2", "x"), ("eno1", "10.0.0.2")),
             2: net("c", None, ("eno1", "10.0.0.3"))}
    reached: dict[int, dict[int, set[int]]] = {0: {}, 1: {0: {0}}, 2: {0: {0}}}
    missing = unreached(nodes, reached, "NCCL")
    assert missing == {1: [0, 2]}
    assert problems(nodes, "NCCL", missing, reached) == [
        "node 1 (b) would bootstrap NCCL over eno1 (10.0.0.2; x), which nodes 0, 2 cannot reach; nodes 0, 2 "
        "reached no address of node 1: check the route and the firewall between them",
        "node 2 (c) has no interface that NCCL would bootstrap over (NCCL_SOCKET_IFNAME names none of its "
        "interfaces: eno1); set NCCL_SOCKET_IFNAME to one"]
    assert unreached(nodes, {0: {1: {0}}, 1: {0: {0}}}, "NCCL") == {}  # node 2 gave no results: left out


def test_node_lists_read_as_people_write_them() -> None:
    assert [node_list(n) for n in ([2], [0, 1], [0, 1, 2], [2, 0, 5])] == [
        "node 2", "nodes 0, 1", "nodes 0-2", "nodes 0, 2, 5"]
