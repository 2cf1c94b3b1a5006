"""A rank's memory policy under --numa-binding, set in a real process and read back from the kernel."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpboot.launch.procs.mempolicy import refused

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
    why = refused([0])
    if why is not None:
        pytest.skip(f"this kernel refuses a memory policy: {why}")
    assert policy_after([0]) in ("prefer (many):0", "prefer:0")  # MPOL_PREFERRED before Linux 5.15


def test_no_nodes_leave_the_default_policy() -> None:
    assert policy_after([]) == "default"


def test_a_refusal_is_found_without_touching_the_callers_policy() -> None:
    code = ("from ddpboot.launch.procs.mempolicy import refused; print(refused([4095]) is not None, "
            "open('/proc/self/numa_maps').readline().split(' ', 1)[1].split(' file=')[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    bogus, policy = out.stdout.split(" ", 1)
    assert bogus == "True"  # no node 4095: the kernel refuses, and says why
    assert policy.strip() == "default"  # tried in a thread: this process's policy is untouched
