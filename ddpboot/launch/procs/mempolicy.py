"""A rank's memory policy under `--numa-binding`: its pages preferred from the NUMA nodes of its cores.

set_mempolicy(2) with MPOL_PREFERRED_MANY (Linux 5.15+; MPOL_PREFERRED on the first node before that), called in
the forked child just before exec: the policy is kept across exec and inherited by the rank's threads and
children. Preferred, not bound: when those nodes are full the kernel takes pages elsewhere rather than OOM-kill
the rank. (The fast-start process does the same for the ranks it forks, in its own copy of these lines: it
imports nothing of ddpboot.)
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Sequence

MPOL_PREFERRED = 1
MPOL_PREFERRED_MANY = 5
SYSCALLS = {"x86_64": 238, "aarch64": 237, "ppc64le": 260}  # set_mempolicy's number per architecture
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, in the launcher, not in a forked child


def prefer_nodes(nodes: Sequence[int]) -> None:
    """Prefer memory from `nodes` for this process (and what it execs); OSError when the kernel refuses."""
    number = SYSCALLS.get(platform.machine())
    if not nodes or number is None:
        return
    for mode, chosen in ((MPOL_PREFERRED_MANY, list(nodes)), (MPOL_PREFERRED, [min(nodes)])):
        words = max(chosen) // 64 + 1
        mask = (ctypes.c_ulong * words)()
        for n in chosen:
            mask[n // 64] |= 1 << (n % 64)
        if _LIBC.syscall(number, mode, mask, ctypes.c_ulong(words * 64 + 1)) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: a kernel without MPOL_PREFERRED_MANY; the single node comes next
            raise OSError(err, os.strerror(err))
    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
