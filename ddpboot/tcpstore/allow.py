"""Which addresses may reach a multi-node job's store: the allow-list, and the check the server makes on accept.

A store on a routable address (node 0 of a multi-node job) takes connections from every host that reaches it. When
the job's hosts are known (under SLURM, its node list) or the user names them (`--store-allow`), the server serves
only connections whose source address is in the list: an address, a CIDR network, or a host name, resolved once,
when the list is made, to every address it has.

The rule applies to every source address, loopback addresses included, with one exception: 127.0.0.1 and ::1, the
source addresses the kernel gives a connection from this machine to one of its own addresses, are always let
through to the uid rule (owner.py), so the job's own node and its ranks never depend on how the host names resolve.
Another loopback address (127.0.0.2) is only ever the source of a client that bound it explicitly: it is judged by
the list like any other (this is what lets the tests stand a refused "other host" on one machine).

docs/security.md says what this protects and what it does not.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddpboot.errors import UsageError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOCAL_SOURCES = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))


def plain_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `text` names (an IPv4-mapped IPv6 address as its IPv4 one; a zone index dropped), or None."""
    try:
        parsed = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def resolve_host(name: str) -> tuple[Network, ...]:
    """Every address `name` resolves to, each as a one-address network; () when it does not resolve."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    found = {plain_address(str(info[4][0])) for info in infos}
    return tuple(sorted({ipaddress.ip_network(a) for a in found if a is not None}, key=str))


@dataclass(frozen=True)
class AllowList:
    """The networks whose connections a store serves, and where the list came from (for messages)."""

    networks: tuple[Network, ...]
    origin: str  # e.g. "--store-allow 10.0.0.0/8", "the SLURM job's nodes n[1-2]"

    def allows(self, address: str) -> bool:
        parsed = plain_address(address)
        if parsed is None:
            return False
        return any(parsed in net for net in (*LOCAL_SOURCES, *self.networks) if net.version == parsed.version)

    def merged(self, other: AllowList | None) -> AllowList:
        if other is None:
            return self
        return AllowList(tuple(dict.fromkeys((*self.networks, *other.networks))), f"{self.origin} and {other.origin}")


def parse_allow_entry(entry: str, option: str) -> tuple[Network, ...]:
    """One entry of an allow-list: an address, a CIDR network (host bits ignored), or a host name (resolved now)."""
    try:
        return (ipaddress.ip_network(entry, strict=False),)
    except ValueError:
        pass
    addresses = resolve_host(entry)
    if not addresses:
        raise UsageError(
            f"{option}: {entry!r} is neither an address, a network (10.0.0.0/8) nor a host name that resolves here."
        )
    return addresses


def parse_allow_list(text: str, option: str = "--store-allow") -> AllowList:
    """`HOST[,HOST...]`: addresses, CIDR networks and host names, comma-separated."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries:
        raise UsageError(f"{option} {text!r}: give addresses, networks or host names, comma-separated.")
    networks = [net for entry in entries for net in parse_allow_entry(entry, option)]
    return AllowList(tuple(dict.fromkeys(networks)), f"{option} {','.join(entries)}")


def hosts_allow_list(hosts: Iterable[str], origin: str) -> tuple[AllowList, list[str]]:
    """The addresses of `hosts`, and the names among them that did not resolve (left out)."""
    networks: list[Network] = []
    unresolved: list[str] = []
    for host in hosts:
        found = resolve_host(host)
        networks.extend(found)
        if not found:
            unresolved.append(host)
    return AllowList(tuple(dict.fromkeys(networks)), origin), unresolved


class AddressGate:
    """Closes connections from addresses outside the list; each refused address is reported once via `warn`."""

    def __init__(self, allow: AllowList, warn: Callable[[str], None]) -> None:
        self.allow = allow
        self.warn = warn
        self.reported: set[str] = set()

    def admit(self, sock: socket.socket) -> bool:
        try:
            address = str(sock.getpeername()[0])
        except OSError:  # reset by the client before we looked
            return False
        if self.allow.allows(address):
            return True
        if address not in self.reported:
            self.reported.add(address)
            self.warn(f"refused a connection from {address}: only the job's hosts ({self.allow.origin}) may use "
                      "its store")
        return False
