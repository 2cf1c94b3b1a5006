"""The network check at the nodes' check-in, as pure decisions (nodes/netprobe.py does the I/O): which address each
node's NCCL and gloo bootstrap would use, and what it means when another node cannot reach it.

The most common multi-node failure is a hang of minutes in init_process_group: a node's communication library
bootstraps over an address that the other nodes cannot reach. NCCL picks its interface as its own source does
(src/misc/socket.cc, ncclFindInterfaces): `NCCL_SOCKET_IFNAME` (a comma list of name prefixes, `^` to exclude,
`=` for exact names), else the first `ib*` interface, else the first that is neither `docker*` nor `lo`, else
`docker*`, else `lo`, each in getifaddrs' order (IPv4 addresses first), IPv6 loopback never, `NCCL_SOCKET_FAMILY`
(AF_INET, AF_INET6) restricting the family; the subnet match it makes with `NCCL_COMM_ID` is not modelled. gloo,
as torch's ProcessGroupGloo: the first interface of `GLOO_SOCKET_IFNAME` (its first address), else the first
address the host name resolves to that it can bind, else 127.0.0.1.

Each node listens for a moment on that address and on every other address of its interfaces, and every node
connects to every other node's bootstrap address; a node whose address some other node could not reach is then
probed on its other interfaces, so that the message can name one that works. A mismatch is one message per node:
"node 3 (gpu07) would bootstrap NCCL over docker0 (172.17.0.1), which nodes 0-2 cannot reach; set
NCCL_SOCKET_IFNAME=ib0".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

NCCL_VAR = "NCCL_SOCKET_IFNAME"
GLOO_VAR = "GLOO_SOCKET_IFNAME"
GLOO_LOOPBACK = "127.0.0.1"  # torch's fallback when the host name resolves to nothing it can bind


@dataclass(frozen=True)
class Iface:
    """One address of an interface, in getifaddrs' order."""

    name: str
    addr: str
    v6: bool = False


@dataclass(frozen=True)
class Choice:
    """The address a library's bootstrap would use on a node, and why (for the message)."""

    lib: str  # "NCCL" or "gloo"
    iface: str  # "" where no interface has the address (gloo's host name)
    addr: str
    why: str = ""

    @property
    def var(self) -> str:
        return NCCL_VAR if self.lib == "NCCL" else GLOO_VAR

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, str] | None) -> Choice | None:
        return None if raw is None else cls(str(raw["lib"]), str(raw["iface"]), str(raw["addr"]), str(raw["why"]))


def _matches(name: str, spec: str) -> bool:
    """NCCL's matchIfList: `spec` a comma list of prefixes (`=`: exact names; `^`: none of them)."""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [p.split(":")[0] for p in spec.split(",") if p]
    hit = any(name == p if exact else name.startswith(p) for p in names)
    return hit != exclude


def _find(ifaces: Sequence[Iface], spec: str, family: str | None) -> Iface | None:
    for iface in ifaces:
        if family is not None and iface.v6 != (family == "AF_INET6"):
            continue
        if iface.v6 and ipaddress.ip_address(iface.addr.split("%")[0]).is_loopback:
            continue
        if _matches(iface.name, spec):
            return iface
    return None


def nccl_choice(ifaces: Sequence[Iface], env: Mapping[str, str]) -> Choice | None:
    """NCCL's bootstrap interface on this node; None where it would find none (NCCL then fails at init)."""
    family = env.get("NCCL_SOCKET_FAMILY")
    family = family if family in ("AF_INET", "AF_INET6") else None
    given = env.get(NCCL_VAR, "")
    if len(given) > 1:
        found = _find(ifaces, given, family)
        return None if found is None else Choice("NCCL", found.name, found.addr, f"{NCCL_VAR}={given}")
    for spec, why in (("ib", "the first ib* interface"), ("^docker,lo", "the first that is neither docker* nor lo"),
                      ("docker", "no other than docker*"), ("lo", "no interface but lo")):
        found = _find(ifaces, spec, family)
        if found is not None:
            return Choice("NCCL", found.name, found.addr, f"{why}; {NCCL_VAR} is not set")
    return None


def gloo_choice(ifaces: Sequence[Iface], env: Mapping[str, str], hostname: str, bindable: Sequence[str],
                source: str = "") -> Choice | None:
    """gloo's bootstrap address on this node. `bindable`: the addresses the host name resolves to that this node
    can bind, in order (`source`: where the name resolved, "/etc/hosts" or ""). None: GLOO_SOCKET_IFNAME names no
    interface of this node."""
    given = env.get(GLOO_VAR, "")
    if len(given) > 1:
        name = given.split(",")[0]
        found = next((i for i in ifaces if i.name == name), None)
        return None if found is None else Choice("gloo", found.name, found.addr, f"{GLOO_VAR}={given}")
    if bindable:
        addr = bindable[0]
        where = f", from {source}" if source else ""
        return Choice("gloo", interface_of(ifaces, addr), addr, f"its host name {hostname} resolves to it{where}")
    return Choice("gloo", interface_of(ifaces, GLOO_LOOPBACK), GLOO_LOOPBACK,
                  f"its host name {hostname} resolves to no address of this node")


def interface_of(ifaces: Sequence[Iface], addr: str) -> str:
    """The interface that has `addr` (a loopback address: the loopback interface, which holds all of 127/8)."""
    found = next((i.name for i in ifaces if i.addr == addr), "")
    if not found and ipaddress.ip_address(addr.split("%")[0]).is_loopback:
        found = next((i.name for i in ifaces if ipaddress.ip_address(i.addr.split("%")[0]).is_loopback), "")
    return found


def candidates(ifaces: Sequence[Iface], limit: int = 8) -> list[Iface]:
    """Each interface's first address that another host could reach (no loopback, no IPv6 link-local)."""
    seen: dict[str, Iface] = {}
    for iface in ifaces:
        ip = ipaddress.ip_address(iface.addr.split("%")[0])
        if iface.name not in seen and not ip.is_loopback and not ip.is_link_local:
            seen[iface.name] = iface
    return list(seen.values())[:limit]


@dataclass(frozen=True)
class NodeNet:
    """What one node reported: its host, its bootstrap choices, and where it listened (iface, addr, port)."""

    host: str
    choices: Mapping[str, Choice | None]  # "NCCL" / "gloo" → its choice
    listen: Sequence[tuple[str, str, int]]

    def endpoint(self, addr: str) -> int | None:
        return next((i for i, (_, a, _) in enumerate(self.listen) if a == addr), None)


def unreached(nodes: Mapping[int, NodeNet], reached: Mapping[int, Mapping[int, set[int]]], lib: str
              ) -> dict[int, list[int]]:
    """For each node whose `lib` bootstrap address some other node did not reach: those nodes. `reached[a][b]`:
    the endpoints of node b that node a reached (nodes that gave no results are left out)."""
    out: dict[int, list[int]] = {}
    for b, net in nodes.items():
        choice = net.choices.get(lib)
        index = None if choice is None else net.endpoint(choice.addr)
        if index is None:
            continue
        missing = [a for a in sorted(reached) if a != b and index not in reached[a].get(b, set())]
        if missing:
            out[b] = missing
    return out


def problems(nodes: Mapping[int, NodeNet], lib: str, missing: Mapping[int, Sequence[int]],
             reached: Mapping[int, Mapping[int, set[int]]]) -> list[str]:
    """The messages: a node with no bootstrap address at all, and each node that others could not reach (with an
    interface of it that they all reached, from `reached`, where there is one)."""
    out = []
    for b, net in sorted(nodes.items()):
        choice = net.choices.get(lib)
        where = f"node {b} ({net.host})"
        if choice is None:
            var = NCCL_VAR if lib == "NCCL" else GLOO_VAR
            out.append(f"{where} has no interface that {lib} would bootstrap over ({var} names none of its "
                       f"interfaces: {', '.join(sorted({n for n, _, _ in net.listen})) or 'none'}); set {var} to one")
            continue
        if b not in missing:
            continue
        others = missing[b]
        over = f"{choice.iface} ({choice.addr}; {choice.why})" if choice.iface else f"{choice.addr} ({choice.why})"
        text = f"{where} would bootstrap {lib} over {over}, which {node_list(others)} cannot reach"
        good = [name for i, (name, addr, _) in enumerate(net.listen)
                if addr != choice.addr and all(i in reached[a].get(b, set()) for a in others)]
        if good:
            text += f"; set {choice.var}={good[0]}"
        else:
            text += (f"; {node_list(others)} reached no address of node {b}: check the route and the firewall "
                     "between them")
        out.append(text)
    return out


def node_list(nodes: Sequence[int]) -> str:
    """`node 2`, `nodes 0-2`, `nodes 0, 2, 5`."""
    ordered = sorted(nodes)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"nodes {ordered[0]}-{ordered[-1]}"
    return f"node{'s' if len(ordered) > 1 else ''} {', '.join(map(str, ordered))}"
