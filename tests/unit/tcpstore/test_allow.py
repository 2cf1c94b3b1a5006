"""The store's allow-list (ddpboot.tcpstore.allow): addresses, CIDR networks and names resolved once; IPv4-mapped
peers judged as IPv4; this machine's own source addresses (127.0.0.1, ::1) always let through to the uid rule."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from ddpboot.errors import UsageError
from ddpboot.tcpstore.allow import AllowList, hosts_allow_list, parse_allow_list, plain_address, resolve_host


@pytest.mark.parametrize(
    ("entries", "address", "allowed"),
    [
        ("10.1.2.3", "10.1.2.3", True),
        ("10.1.2.3", "10.1.2.4", False),
        ("10.0.0.0/8", "10.200.0.1", True),
        ("10.0.0.0/8", "11.0.0.1", False),
        ("10.1.2.3/24", "10.1.2.200", True),  # host bits of a network are ignored
        ("10.0.0.0/8", "::ffff:10.9.9.9", True),  # a dual-stack listener's view of an IPv4 client
        ("fd00::/8", "fd12::5", True),
        ("fd00::/8", "10.0.0.1", False),
        ("10.0.0.0/8", "127.0.0.2", False),  # another loopback address is judged like any other
        ("10.0.0.0/8", "127.0.0.1", True),  # this machine's own connections: the uid rule decides
        ("10.0.0.0/8", "::1", True),
        ("10.0.0.0/8", "::ffff:127.0.0.1", True),
        ("10.0.0.0/8", "fe80::1%eth0", False),
        ("10.0.0.0/8", "not an address", False),
    ],
)
def test_the_allow_decision(entries: str, address: str, allowed: bool) -> None:
    assert parse_allow_list(entries).allows(address) is allowed


def test_names_are_resolved_to_every_address_when_the_list_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"n1": ["10.0.0.1", "fd00::1"], "n2": ["::ffff:10.0.0.2"]}

    def getaddrinfo(host: str, port: Any, **_: Any) -> list[tuple[Any, ...]]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
                for a in table[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    allow = parse_allow_list("n1, n2,192.0.2.0/24")
    assert allow.allows("10.0.0.1") and allow.allows("fd00::1") and allow.allows("10.0.0.2")
    assert allow.allows("192.0.2.77") and not allow.allows("10.0.0.3")
    assert allow.origin == "--store-allow n1,n2,192.0.2.0/24"
    with pytest.raises(UsageError, match="'nowhere' is neither an address, a network"):
        parse_allow_list("n1,nowhere")
    hosts, unresolved = hosts_allow_list(["n1", "nowhere"], "the job's nodes")
    assert unresolved == ["nowhere"] and hosts.allows("10.0.0.1") and not hosts.allows("10.0.0.2")


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(UsageError, match="give addresses, networks or host names"):
        parse_allow_list(" , ")


def test_localhost_resolves_to_loopback() -> None:
    assert ipaddress.ip_network("127.0.0.1/32") in resolve_host("localhost")
    assert resolve_host("no-such-host.invalid") == ()


def test_lists_merge_without_repeats() -> None:
    one = parse_allow_list("10.0.0.1")
    both = one.merged(parse_allow_list("10.0.0.1,10.0.0.2"))
    assert [str(n) for n in both.networks] == ["10.0.0.1/32", "10.0.0.2/32"]
    assert one.merged(None) is one
    assert plain_address("::ffff:10.0.0.1") == ipaddress.ip_address("10.0.0.1")
    assert AllowList((), "nothing").allows("127.0.0.1") and not AllowList((), "nothing").allows("10.0.0.1")
