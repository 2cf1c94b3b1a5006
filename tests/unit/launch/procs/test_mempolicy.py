"""A rank's memory policy under --numa-binding, set in a real process and read back from the kernel."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
from ddpboot.launch.procs.mempolicy import prefer_nodes
prefer_nodes({nodes})
print(open("/proc/self/numa_maps").readline().split(" ", 1)[1].split(" file=")[0])
"""


def policy_after(nodes: list[int]) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK.format(nodes=nodes)], capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_memory_is_preferred_from_the_nodes_asked_for() -> None:
    assert policy_after([0]) == "prefer (many):0"


def test_no_nodes_leave_the_default_policy() -> None:
    assert policy_after([]) == "default"
