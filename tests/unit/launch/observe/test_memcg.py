"""memcg.py on a cgroup tree laid out as the kernel lays it out (a mountinfo, /proc/PID/cgroup, the counter files),
for v1 and v2, with the cgroups above the rank's, a cgroup at a hierarchy's root and one of a container's mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.launch.observe.memcg import Counters, kernel_kill_line, memory_cgroup, node_oom_kills

V1_MOUNTS = ("30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
             "31 25 0:27 {root} {point} rw,relatime shared:10 - cgroup cgroup rw,memory\n")
V2_MOUNTS = "29 23 0:25 {root} {point} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def tree(tmp_path: Path, version: int, path: str, root: str = "/") -> tuple[Path, Path]:
    point = tmp_path / "cg"
    (tmp_path / "proc" / "7").mkdir(parents=True, exist_ok=True)
    line = f"0::{path}\n" if version == 2 else f"5:cpu:/\n4:memory:{path}\n"
    (tmp_path / "proc" / "7" / "cgroup").write_text(line)
    (tmp_path / "mountinfo").write_text((V2_MOUNTS if version == 2 else V1_MOUNTS).format(root=root, point=point))
    return tmp_path / "proc", tmp_path / "mountinfo"


def files(d: Path, version: int, kills: int, limit: str, peak: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if version == 2:
        (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
        (d / "memory.max").write_text(limit + "\n")
        (d / "memory.peak").write_text(f"{peak}\n")
    else:
        (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
        (d / "memory.limit_in_bytes").write_text(limit + "\n")
        (d / "memory.max_usage_in_bytes").write_text(f"{peak}\n")


@pytest.mark.parametrize("version", [1, 2])
def test_the_rank_s_cgroup_and_those_above_it(tmp_path: Path, version: int) -> None:
    proc, mountinfo = tree(tmp_path, version, "/job/step")
    unlimited = "max" if version == 2 else "9223372036854771712"
    files(tmp_path / "cg" / "job", version, 4, "2048", 2000)
    files(tmp_path / "cg" / "job" / "step", version, 1, unlimited, 1000)
    cg = memory_cgroup(7, proc, mountinfo)
    assert cg is not None and cg.version == version and cg.directory == tmp_path / "cg" / "job" / "step"
    assert cg.read() == [Counters("/job/step", version, 1, None, 1000), Counters("/job", version, 4, 2048, 2000)]


def test_a_container_s_mount_of_its_own_cgroup(tmp_path: Path) -> None:
    proc, mountinfo = tree(tmp_path, 2, "/kubepods/pod1/c1/app", root="/kubepods/pod1/c1")
    files(tmp_path / "cg" / "app", 2, 0, "4096", 10)
    cg = memory_cgroup(7, proc, mountinfo)
    assert cg is not None and cg.directory == tmp_path / "cg" / "app"
    assert cg.read() == [Counters("/kubepods/pod1/c1/app", 2, 0, 4096, 10)]


def test_no_cgroup_at_a_root_without_a_memory_hierarchy_or_for_a_process_that_is_gone(tmp_path: Path) -> None:
    proc, mountinfo = tree(tmp_path, 2, "/")
    assert memory_cgroup(7, proc, mountinfo) is None  # the root holds no limit
    assert memory_cgroup(8, proc, mountinfo) is None
    proc, mountinfo = tree(tmp_path, 1, "/job")
    files(tmp_path / "cg" / "job", 1, 0, "4096", 10)
    assert memory_cgroup(7, proc, mountinfo) is not None
    mountinfo.write_text(V1_MOUNTS.splitlines()[0] + "\n")  # no memory controller mounted
    assert memory_cgroup(7, proc, mountinfo) is None


def test_unreadable_counters_are_none(tmp_path: Path) -> None:
    proc, mountinfo = tree(tmp_path, 2, "/job")
    (tmp_path / "cg" / "job").mkdir(parents=True)
    (tmp_path / "cg" / "job" / "memory.max").write_text("garbage\n")
    cg = memory_cgroup(7, proc, mountinfo)
    assert cg is not None and cg.read() == [Counters("/job", 2, None, None, None)]


def test_the_node_s_oom_kills_and_an_unreadable_kernel_log(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text("pgfault 12\noom_kill 3\n")
    assert node_oom_kills(tmp_path) == 3
    assert node_oom_kills(tmp_path / "none") is None
    line, why = kernel_kill_line(7, tmp_path / "kmsg")
    assert line is None and why is not None and "kernel log cannot be read" in why and "dmesg_restrict=0" in why
