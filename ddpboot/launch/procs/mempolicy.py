"""A rank's memory policy under `--numa-binding`: its pages preferred from the NUMA nodes of its cores.

set_mempolicy(2) with MPOL_PREFERRED_MANY (Linux 5.15+; MPOL_PREFERRED on the first node before that), called in
the forked child just before exec: the policy is kept across exec and inherited by the rank's threads and
children. Preferred, not bound: when those nodes are full the kernel takes pages elsewhere rather than OOM-kill
the rank. It is a preference, so a kernel that refuses the call (EPERM in a container whose seccomp profile wants
CAP_SYS_NICE, ENOSYS without NUMA support) starts the rank anyway: `refused` finds that out once, in the launcher,
so that the launcher can say so. Standard library only: the fast-start process, which imports nothing of ddpboot,
loads this file (launch/faststart/zygote.py) and calls `prefer_nodes` in each rank it forks.
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
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, in the launcher or the zygote, not in a forked child


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


def refused(nodes: Sequence[int]) -> str | None:
    """Why this kernel will not set such a policy (None: it will). Tried in a thread of its own, since a memory
    policy belongs to the thread that sets it: the launcher's own stays as it was."""
    import threading

    why: list[str] = []

    def attempt() -> None:
        try:
            prefer_nodes(nodes)
        except OSError as exc:
            why.append(f"set_mempolicy: {exc.strerror} ({errno.errorcode.get(exc.errno or 0, exc.errno)})")

    t = threading.Thread(target=attempt, name="ddpboot-mempolicy-probe")
    t.start()
    t.join()
    return why[0] if why else None
