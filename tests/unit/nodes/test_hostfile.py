"""The hosts of a job started over ssh (ddpboot/nodes/hostfile.py): the hostfile and --hosts, and each host's GPU
selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.hostfile import (
    Host,
    HostList,
    HostOptions,
    check_counts,
    host_selection,
    parse_hostfile,
    parse_hosts,
    read_hosts,
)
from ddpboot.selection.request import SelectionOptions

DEEPSPEED = """\
# DeepSpeed's hostfile, with ddpboot's per-host GPUs
worker-1 slots=4
worker-2 slots=4 gpus=0,2-3,5   # a comment after a host
  worker-3    slots=4 exclude=1

root@10.0.0.4 slots=4 max_slots=8
fd00::5 slots=4
"""


def test_a_hostfile_names_its_hosts_in_order_with_their_slots_and_gpus() -> None:
    hosts = parse_hostfile(DEEPSPEED, "hosts.txt")
    assert [(h.name, h.slots, h.gpus, h.exclude, h.where) for h in hosts] == [
        ("worker-1", 4, None, None, "hosts.txt:2"),
        ("worker-2", 4, "0,2-3,5", None, "hosts.txt:3"),
        ("worker-3", 4, None, "1", "hosts.txt:4"),
        ("root@10.0.0.4", 4, None, None, "hosts.txt:6"),
        ("fd00::5", 4, None, None, "hosts.txt:7"),
    ]
    assert [h.address for h in hosts] == ["worker-1", "worker-2", "worker-3", "10.0.0.4", "fd00::5"]


def test_hosts_is_horovods_list() -> None:
    hosts = parse_hosts("h1:4, h2:4,[fd00::2]:4,user@h3")
    assert [(h.name, h.slots, h.address) for h in hosts] == [
        ("h1", 4, "h1"), ("h2", 4, "h2"), ("[fd00::2]", 4, "fd00::2"), ("user@h3", None, "h3")]
    assert [(h.name, h.slots) for h in parse_hosts("fd00::2")] == [("fd00::2", None)]


@pytest.mark.parametrize(("text", "message"), [
    ("", "names no host"),
    ("# only a comment\n\n", "names no host"),
    ("h1 slots=0\n", "slots=0: give a number of ranks, 1 or more"),
    ("h1 slots=four\n", "slots=four"),
    ("h1 slot=4\n", "'slot=4' is not one of slots=, gpus=, exclude=, max_slots="),
    ("h1 4\n", "'4' is not one of"),
    ("h1 slots=4 slots=2\n", "slots= is given twice"),
    ("h1 gpus=\n", "gpus= is empty"),
    ("h1 gpus=0 exclude=1\n", "gpus= and exclude= for h1"),
    ("h1 slots=2\nh1 slots=2\n", "h1 is named twice (h:1 and h:2)"),
    ("h1 slots=4\nh2 slots=2\n", "the hosts have different slots (h1: 4, h2: 2)"),
    ("-oProxyCommand=x slots=1\n", "is not a host name or address"),
    ("h;rm slots=1\n", "is not a host name or address"),
])
def test_a_bad_hostfile_is_one_error_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=None) as err:
        parse_hostfile(text, "h")
    assert message in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("h1,,h2", "an empty entry"),
    ("h1:0", "h1:0: slots 0: give a number of ranks"),
    ("h1:4,h1:4", "h1 is named twice"),
    ("h1:4,h2:8", "different slots (h1: 4, h2: 8)"),
    ("-x", "is not a host name"),
])
def test_bad_hosts_are_one_error(text: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_hosts(text)
    assert message in str(err.value)


def test_read_hosts_checks_the_options(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("h1 slots=1\nh2 slots=1\n")
    assert [h.name for h in read_hosts(HostOptions(hostfile=str(tmp_path / "hosts"))).hosts] == ["h1", "h2"]
    assert read_hosts(HostOptions(hosts="a,b")).source == "--hosts"
    for options, message in [
        (HostOptions(hostfile=str(tmp_path / "hosts"), hosts="a"), "--hostfile and --hosts both"),
        (HostOptions(hostfile=str(tmp_path / "none")), "cannot be read"),
        (HostOptions(hostfile=str(tmp_path)), "is a directory"),
        (HostOptions(hosts="a", ssh_port=0), "--ssh-port 0 is not a TCP port"),
        (HostOptions(hosts="a", ssh_identity_file=str(tmp_path / "key")), "--ssh-identity-file"),
    ]:
        with pytest.raises(UsageError) as err:
            read_hosts(options)
        assert message in str(err.value)


def test_each_hosts_selection_is_its_line_over_the_options() -> None:
    sel = SelectionOptions(exclude="7")
    assert host_selection(Host("h", slots=2), sel) == SelectionOptions(nproc="2", exclude="7")
    assert host_selection(Host("h"), sel).nproc == "gpu"  # no slots, no --nproc: every GPU of the host
    assert host_selection(Host("h"), SelectionOptions(nproc="3")).nproc == "3"
    assert host_selection(Host("h"), SelectionOptions(cpu=True)).nproc is None  # CPU ranks: ddpboot's default
    gpus = host_selection(Host("h", gpus="0,2"), SelectionOptions(gpus="1"))
    assert (gpus.nproc, gpus.gpus) == (None, "0,2")  # one rank per listed GPU
    excluded = host_selection(Host("h", slots=1, exclude="0,7"), SelectionOptions(exclude="7,3"))
    assert excluded.exclude == "7,3,0"


def test_nproc_that_contradicts_the_slots_is_an_error() -> None:
    hosts = HostList((Host("h1", slots=2), Host("h2")), "f")
    check_counts(hosts, SelectionOptions(nproc="2"))
    check_counts(hosts, SelectionOptions())  # h2 plans every GPU it has: compared at the check-in
    with pytest.raises(UsageError, match=r"give the hosts different numbers of ranks \(h1: 2, h2: 3\)"):
        check_counts(hosts, SelectionOptions(nproc="3"))
