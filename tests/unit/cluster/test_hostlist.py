"""SLURM host lists expand as `scontrol show hostnames` expands them, as checked against slurm-wlm 22.05.

The `slurm`-marked class compares with the real scontrol. What it needs (checked on Debian 12, slurm-wlm 22.05):
`apt-get install slurm-wlm` for the `scontrol` binary, and a slurm.conf with at least ClusterName and
SlurmctldHost, which the test writes itself and points SLURM_CONF at. No daemon (slurmctld, slurmd, munged) has to
run: `show hostnames` expands locally. Without any slurm.conf scontrol fails ("Could not establish a configuration
source").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpboot.cluster.hostlist import MAX_HOSTS, expand_hostlist, first_host
from ddpboot.errors import UsageError

# --- examples ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        # padding width comes from each range's low bound
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[008-10]", ["n008", "n009", "n010"]),
        ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
        ("n[01-3,5]", ["n01", "n02", "n03", "n5"]),
        ("n[98-100]", ["n98", "n99", "n100"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        # text after the group, and several groups (last fastest)
        ("gpu-a[1-2]-ib", ["gpu-a1-ib", "gpu-a2-ib"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[1-2][3-4]", ["x13", "x14", "x23", "x24"]),
        # three groups: SLURM expands the ones before the last from right to left (measured with scontrol 22.05)
        (
            "a[1-2]b[3-4]c[5-6]",
            ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
        ),
        # separators: commas, whitespace, both; commas inside brackets do not split hosts
        ("a,b c\td\ne", ["a", "b", "c", "d", "e"]),
        ("a, b ,c", ["a", "b", "c"]),
        ("  n[1-2]  ", ["n1", "n2"]),
        ("d[1-2],n[01-02],login", ["d1", "d2", "n01", "n02", "login"]),
        # order as written, duplicates kept (scontrol does the same)
        ("b,a,a", ["b", "a", "a"]),
        ("n[5,1-2]", ["n5", "n1", "n2"]),
        ("n[1-3,2]", ["n1", "n2", "n3", "n2"]),
        # no brackets: a literal name, even with a dash and digits
        ("node1-3", ["node1-3"]),
        ("10.0.0.1", ["10.0.0.1"]),
        ("[1-2]", ["1", "2"]),
        ("n1[2-3]", ["n12", "n13"]),
    ],
)
def test_expands_like_slurm(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts
    assert first_host(expr) == hosts[0]


def test_first_host_does_not_expand_a_large_list() -> None:
    # 100 000 hosts: first_host must not build them all, but the count check still applies to the whole list
    assert first_host(f"n[00000-{MAX_HOSTS - 1}]") == "n00000"
    assert len(expand_hostlist(f"n[0-{MAX_HOSTS - 1}]")) == MAX_HOSTS


def test_first_host_checks_the_whole_expression() -> None:
    with pytest.raises(UsageError, match="never closed"):
        first_host("good1,bad[1-2")


# --- malformed lists ------------------------------------------------------------------------------------


def caret_column(message: str, expr: str) -> int:
    """Where the caret points in the error message, as an index into expr."""
    lines = message.splitlines()
    shown = "".join(" " if ch.isspace() else ch for ch in expr)
    row = lines.index(f"  {shown}")
    caret = lines[row + 1]
    assert caret.strip() == "^", message
    return caret.index("^") - 2


@pytest.mark.parametrize(
    ("expr", "pos", "problem"),
    [
        ("node[1-4", 4, "never closed"),
        ("node[1-4,gpu[1-2]", 12, "nest"),
        ("node1-4]", 7, "without a matching"),
        ("a[1-2]],b", 6, "without a matching"),
        ("node[3-1]", 5, "goes down"),
        ("node[a-b]", 5, "not a number"),
        ("node[-1]", 5, "not a number"),
        ("node[1--2]", 5, "not a number"),
        ("node[1-2-3]", 5, "not a number"),
        ("node[]", 5, "empty range"),
        ("node[1,]", 7, "empty range"),
        ("node[,1]", 5, "empty range"),
        ("node[1 -2]", 6, "whitespace inside brackets"),
        ("a,,b", 2, "empty item"),
        ("a, ,b", 3, "empty item"),
        (",a", 0, "empty item"),
        ("a,", 1, "empty item"),
        ("", 0, "empty host list"),
        (" \t", 0, "empty host list"),
        ("n[٣]", 2, "not a number"),  # a non-ASCII digit is not a SLURM number
    ],
)
def test_malformed_list_names_the_position(expr: str, pos: int, problem: str) -> None:
    with pytest.raises(UsageError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert problem in message
    assert caret_column(message, expr) == pos
    assert f"character {pos + 1}" in message


@pytest.mark.parametrize("expr", [f"n[0-{MAX_HOSTS}]", "a[0-999]b[0-999]", "n[0-99999999999999999999999]"])
def test_absurd_expansions_are_refused_before_building_them(expr: str) -> None:
    with pytest.raises(UsageError, match=f"more than the {MAX_HOSTS}"):
        expand_hostlist(expr)
    with pytest.raises(UsageError, match="hosts"):
        first_host(expr)


def test_the_limit_counts_the_whole_list() -> None:
    half = MAX_HOSTS // 2
    with pytest.raises(UsageError, match="more than"):
        expand_hostlist(f"a[0-{half}],b[0-{half}]")


# --- properties: a test-side compressor round-trips ------------------------------------------------------

_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress(hosts: list[str]) -> str:
    """Bracket form of `hosts`, keeping their order: consecutive hosts that differ only in their last number merge.

    A host joins the current range only if SLURM would print it that way: its number, padded to the width of the
    range's low bound, must be exactly its digits (so 9 -> 10 joins `[9-10]`, 09 -> 10 joins `[09-10]`, but 9 -> 010
    starts a new range).
    """
    items: list[list[object]] = []  # [prefix, suffix, [[lo_digits, hi], ...]] or [host]
    for host in hosts:
        match = _TAIL_NUMBER.match(host)
        if match is None:
            items.append([host])
            continue
        prefix, digits, suffix = match.groups()
        last = items[-1] if items else None
        if last is not None and len(last) == 3 and last[0] == prefix and last[1] == suffix:
            ranges = last[2]
            assert isinstance(ranges, list)
            lo_digits, hi = ranges[-1]
            if str(hi + 1).zfill(len(lo_digits)) == digits:
                ranges[-1][1] = hi + 1
            else:
                ranges.append([digits, int(digits)])
        else:
            items.append([prefix, suffix, [[digits, int(digits)]]])
    parts = []
    for item in items:
        if len(item) == 1:
            parts.append(str(item[0]))
            continue
        prefix, suffix, ranges = item
        assert isinstance(ranges, list)
        spans = [lo if int(lo) == hi else f"{lo}-{hi}" for lo, hi in ranges]
        parts.append(f"{prefix}[{','.join(spans)}]{suffix}")
    return ",".join(parts)


def test_compress_helper_compresses() -> None:
    # the helper itself must do something, or the round trip below proves nothing
    assert compress(["n08", "n09", "n10", "n12", "m1"]) == "n[08-10,12],m[1]"
    assert compress(["n9", "n010"]) == "n[9,010]"
    assert compress(["gpu-a1-ib", "gpu-a2-ib"]) == "gpu-a[1-2]-ib"


_prefix = st.sampled_from(["n", "node", "gpu-a", "rack1-n", "r2x", "", "a.b-"])
_suffix = st.sampled_from(["", "", "-ib", ".cluster", "x"])


@st.composite
def runs_of_hosts(draw: st.DrawFn) -> list[str]:
    """Hosts in runs of consecutive numbers (what SLURM lists look like), with random padding and names."""
    hosts: list[str] = []
    for _ in range(draw(st.integers(1, 5))):
        prefix, suffix = draw(_prefix), draw(_suffix)
        width = draw(st.integers(1, 4))
        start = draw(st.integers(0, 120))
        for n in range(start, start + draw(st.integers(1, 15))):
            hosts.append(prefix + str(n).zfill(width) + suffix)
    return hosts


_any_host = st.builds(
    lambda p, n, w, s: p + str(n).zfill(w) + s, _prefix, st.integers(0, 10**6), st.integers(1, 8), _suffix
) | st.sampled_from(["login", "head-node", "a.b.c"])


@given(st.one_of(runs_of_hosts(), st.lists(_any_host, min_size=1, max_size=30)))
def test_compressed_lists_expand_back_exactly(hosts: list[str]) -> None:
    expr = compress(hosts)
    assert expand_hostlist(expr) == hosts
    assert first_host(expr) == hosts[0]


@given(lo=st.integers(0, 5000), length=st.integers(1, 300), pad=st.integers(0, 4))
def test_padding_comes_from_the_low_bound(lo: int, length: int, pad: int) -> None:
    lo_text = "0" * pad + str(lo)
    hi = lo + length - 1
    hosts = expand_hostlist(f"n[{lo_text}-{hi}]")
    assert [int(h[1:]) for h in hosts] == list(range(lo, hi + 1))
    assert all(len(h) - 1 == max(len(lo_text), len(str(int(h[1:])))) for h in hosts)


@given(
    groups=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=4), min_size=2, max_size=2),
    mid=st.sampled_from(["-n", "x", ""]),
    suffix=_suffix,
)
def test_two_groups_expand_in_lexicographic_order(groups: list[list[int]], mid: str, suffix: str) -> None:
    first, second = groups
    expr = f"r[{','.join(map(str, first))}]{mid}[{','.join(map(str, second))}]{suffix}"
    assert expand_hostlist(expr) == [f"r{a}{mid}{b}{suffix}" for a in first for b in second]


# --- against the real scontrol -------------------------------------------------------------------------

SCONTROL = shutil.which("scontrol")


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    conf = Path(tmp_path_factory.mktemp("slurm")) / "slurm.conf"
    conf.write_text("ClusterName=hostlisttest\nSlurmctldHost=localhost\n")
    return {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def scontrol_hostnames(expr: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [str(SCONTROL), "show", "hostnames", expr], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert "Invalid hostlist" not in out.stdout + out.stderr, (expr, out.stdout, out.stderr)
    return out.stdout.split()


def slurm_22_05_form(hosts: list[str]) -> bool:
    # scontrol 22.05 rejects text after the last bracket group (`n[1-2]-ib`); our superset accepts it.
    return not re.search(r"\][^,\[]", compress(hosts) + ",")


@st.composite
def multi_group_expr(draw: st.DrawFn) -> str:
    def group() -> str:
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            lo = draw(st.integers(0, 12))
            width = draw(st.integers(1, 3))
            hi = lo + draw(st.integers(0, 3))
            ranges.append(str(lo).zfill(width) if hi == lo else f"{str(lo).zfill(width)}-{hi}")
        return "[" + ",".join(ranges) + "]"

    k = draw(st.integers(1, 4))
    parts = [draw(st.sampled_from(["n", "rack", "a-"]))]
    for i in range(k):
        parts.append(group())
        if i < k - 1:
            parts.append(draw(st.sampled_from(["-n", "x", "", "b"])))
    return "".join(parts)


@pytest.mark.slurm
@pytest.mark.skipif(SCONTROL is None, reason="scontrol is not on PATH (apt-get install slurm-wlm provides it)")
class TestAgainstScontrol:
    @pytest.mark.parametrize(
        "expr",
        ["node[01-04,07]", "n[08-10]", "n[8-10]", "n[1-010]", "rack[1-2]-n[01-02]", "b,a,a", "a b,c", "x[1-2][3-4]"],
    )
    def test_examples(self, expr: str, scontrol_env: dict[str, str]) -> None:
        assert expand_hostlist(expr) == scontrol_hostnames(expr, scontrol_env)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.one_of(runs_of_hosts(), st.lists(_any_host, min_size=1, max_size=20)).filter(slurm_22_05_form))
    def test_compressed_lists(self, scontrol_env: dict[str, str], hosts: list[str]) -> None:
        expr = compress(hosts)
        assert expand_hostlist(expr) == scontrol_hostnames(expr, scontrol_env) == hosts

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(multi_group_expr(), min_size=1, max_size=3))
    def test_multi_group_lists(self, scontrol_env: dict[str, str], exprs: list[str]) -> None:
        expr = ",".join(exprs)
        assert expand_hostlist(expr) == scontrol_hostnames(expr, scontrol_env)
