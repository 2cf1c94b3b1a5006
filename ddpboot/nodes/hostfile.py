"""A job's hosts as a hostfile or `--hosts` names them, for one ddpboot launcher per host started over ssh
(launch/remote.py): pure parsing and the per-host GPU selection.

The hostfile is DeepSpeed's and Open MPI's format: one host a line, `slots=N` for its ranks, `#` to the end of the
line a comment. Open MPI's `max_slots=N` (a cap on oversubscription, which ddpboot does not do) is read and not
used. A line may also say which GPUs of that host the job uses: `gpus=0,2` (exactly these, as `--gpus`) or
`exclude=0` (never these, besides what `--exclude` says for every host). `--hosts h1:4,h2:4` is Horovod's form
(`:N` the slots). A host is a name or an address, optionally `user@host` (the ssh login there).

The first host is node 0: it serves the job's store, at the host's name as written unless `--master-addr` says
otherwise. Every host runs the same number of ranks (ddpboot numbers them node rank × ranks per node + local rank):
slots that differ are an error here, and counts that only each host knows (`--nproc gpu`) are compared at the
nodes' check-in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.selection.request import SelectionOptions

KEYS = ("slots", "gpus", "exclude", "max_slots")
_HOST = re.compile(r"(?:[A-Za-z0-9._-]+@)?(?:[A-Za-z0-9_.%-]+|\[[0-9A-Fa-f:.%]+\]|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)")


@dataclass(frozen=True)
class HostOptions:
    """The options of a job of several hosts started over ssh, as typed (None: not given)."""

    hostfile: str | None = None  # --hostfile FILE
    hosts: str | None = None  # --hosts h1:N,h2:N
    ssh_port: int | None = None  # --ssh-port
    ssh_identity_file: str | None = None  # --ssh-identity-file
    env: tuple[str, ...] = ()  # --env NAME or NAME=VALUE, more variables for every host

    @property
    def given(self) -> bool:
        return self.hostfile is not None or self.hosts is not None


@dataclass(frozen=True)
class Host:
    """One host of the job: one line of the hostfile, or one entry of --hosts."""

    name: str  # as written: host, user@host, [v6 address]
    slots: int | None = None
    gpus: str | None = None  # gpus=LIST
    exclude: str | None = None  # exclude=LIST
    where: str = ""  # "hosts.txt:3" or "--hosts", for messages

    @property
    def address(self) -> str:
        """The host without its login and brackets: what the other nodes resolve (node 0's store address)."""
        return self.name.rpartition("@")[2].strip("[]")


@dataclass(frozen=True)
class HostList:
    hosts: tuple[Host, ...]
    source: str  # "hosts.txt" or "--hosts", for messages and the plan


def read_hosts(options: HostOptions) -> HostList:
    """The hosts of --hostfile or --hosts (one of them), checked; UsageError for anything wrong."""
    if options.hostfile is not None and options.hosts is not None:
        raise UsageError("--hostfile and --hosts both name the job's hosts: give one of them.")
    if options.ssh_port is not None and not 1 <= options.ssh_port <= 65535:
        raise UsageError(f"--ssh-port {options.ssh_port} is not a TCP port (1-65535).")
    if options.ssh_identity_file is not None and not Path(options.ssh_identity_file).is_file():
        raise UsageError(f"--ssh-identity-file {options.ssh_identity_file}: no such file. Give the private key ssh "
                         "should use (ssh -i), or leave the option out to use your ssh config and agent.")
    if options.hosts is not None:
        return HostList(parse_hosts(options.hosts), "--hosts")
    assert options.hostfile is not None
    path = Path(options.hostfile)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        what = "is a directory" if path.is_dir() else f"cannot be read ({exc.strerror})"
        raise UsageError(f"--hostfile {options.hostfile} {what}. Give a file with one host a line, e.g. "
                         "`node1 slots=4`.") from None
    return HostList(parse_hostfile(text, options.hostfile), options.hostfile)


def parse_hostfile(text: str, source: str) -> tuple[Host, ...]:
    """`host [slots=N] [gpus=LIST] [exclude=LIST] [max_slots=N]` per line; `#` starts a comment."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        name = _check_name(words[0], where)
        fields: dict[str, str] = {}
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep or key not in KEYS:
                raise UsageError(f"--hostfile {where}: {word!r} is not one of {', '.join(k + '=' for k in KEYS)} "
                                 f"(a line is `HOST slots=N`, e.g. `{name} slots=4`).")
            if key in fields:
                raise UsageError(f"--hostfile {where}: {key}= is given twice.")
            fields[key] = value
        slots = _count(fields["slots"], f"--hostfile {where}: slots=") if "slots" in fields else None
        if "max_slots" in fields:
            _count(fields["max_slots"], f"--hostfile {where}: max_slots=")
        hosts.append(Host(name, slots, _list(fields, "gpus", where), _list(fields, "exclude", where), where))
    if not hosts:
        raise UsageError(f"--hostfile {source} names no host: give one host a line (`node1 slots=4`); `#` begins a "
                         "comment.")
    return _checked(tuple(hosts), f"--hostfile {source}")


def parse_hosts(text: str) -> tuple[Host, ...]:
    """Horovod's `h1:4,h2:4` (`:N` optional); an IPv6 address in brackets (`[fd00::2]:4`)."""
    hosts = []
    for part in text.split(","):
        entry = part.strip()
        if not entry:
            raise UsageError(f"--hosts {text!r}: an empty entry; give HOST or HOST:SLOTS, comma-separated "
                             "(--hosts node1:4,node2:4).")
        name, slots = entry, None
        m = re.fullmatch(r"(.+):(\d+)", entry)
        if m and (m.group(1).endswith("]") or ":" not in m.group(1)):
            name, slots = m.group(1), _count(m.group(2), f"--hosts {text}: {entry}: slots ")
        hosts.append(Host(_check_name(name, "--hosts"), slots, where="--hosts"))
    return _checked(tuple(hosts), "--hosts")


def _check_name(name: str, where: str) -> str:
    if name.startswith("-") or not _HOST.fullmatch(name):
        raise UsageError(f"{where}: {name!r} is not a host name or address (letters, digits, '.', '-', '_'; "
                         "user@host for another login; [v6 address]).")
    return name


def _count(text: str, what: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise UsageError(f"{what}{text}: give a number of ranks, 1 or more.")
    return int(text)


def _list(fields: dict[str, str], key: str, where: str) -> str | None:
    value = fields.get(key)
    if value is not None and not value.strip(","):
        raise UsageError(f"--hostfile {where}: {key}= is empty; name GPUs as --{key} does ({key}=0,2).")
    return value


def _checked(hosts: tuple[Host, ...], what: str) -> tuple[Host, ...]:
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.address in seen:
            first = seen[host.address]
            raise UsageError(f"{what}: {host.address} is named twice ({first.where} and {host.where}); each host "
                             "runs one launcher, a node of the job: give its ranks once, with slots=N.")
        seen[host.address] = host
        if host.gpus is not None and host.exclude is not None:
            raise UsageError(f"{host.where}: gpus= and exclude= for {host.name}: gpus= names exactly the GPUs to "
                             "use there, so give one of them.")
    counts = {h.slots for h in hosts if h.slots is not None}
    if len(counts) > 1:
        listing = ", ".join(f"{h.name}: {h.slots}" for h in hosts if h.slots is not None)
        raise UsageError(f"{what}: the hosts have different slots ({listing}); ddpboot runs the same number of "
                         "ranks on every node (global rank = node rank × ranks per node + local rank). Give every "
                         "host the same slots (e.g. the smallest), or leave a host's GPUs out with exclude=.")
    return hosts


def host_selection(host: Host, selection: SelectionOptions) -> SelectionOptions:
    """The GPU selection of the launcher on `host`: its slots (else --nproc, else one rank per --gpus entry, else
    every GPU of the host), its gpus= (else --gpus), and --exclude with its exclude=."""
    nproc = selection.nproc
    if host.slots is not None:
        nproc = str(host.slots)
    elif nproc is None and host.gpus is None and selection.gpus is None and not selection.cpu:
        nproc = "gpu"
    exclude = [e.strip() for e in (selection.exclude or "").split(",") + (host.exclude or "").split(",")]
    merged = ",".join(dict.fromkeys(e for e in exclude if e))
    return replace(selection, nproc=nproc, gpus=host.gpus if host.gpus is not None else selection.gpus,
                   exclude=merged or None)


def check_counts(hosts: HostList, selection: SelectionOptions) -> None:
    """A --nproc N that contradicts the hosts' slots (the hosts without slots would run N): an error now, rather
    than at the nodes' check-in."""
    counts = {h.name: host_selection(h, selection).nproc for h in hosts.hosts}
    numbers = {n for n in counts.values() if n is not None and n.strip().isdecimal()}
    if len({int(n) for n in numbers}) > 1:
        listing = ", ".join(f"{name}: {n}" for name, n in counts.items())
        raise UsageError(f"--nproc {selection.nproc} and the slots of {hosts.source} give the hosts different "
                         f"numbers of ranks ({listing}); every node runs the same number. Give every host slots=N, "
                         "or drop --nproc.")
