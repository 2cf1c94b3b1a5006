"""What the user asked for, parsed once at the command line's boundary into a typed Request."""

from __future__ import annotations

from ddpboot.selection.planner import DEFAULT_MAX_USED_MEMORY, DEFAULT_MAX_UTIL, Request


def parse_request(
    *,
    nproc: str | None = None,
    gpus: str | None = None,
    exclude: str | None = None,
    gpus_per_proc: int = 1,
    isolation: str = "rank",
    cpu: bool = False,
    max_used_memory: int = DEFAULT_MAX_USED_MEMORY,
    max_util: int = DEFAULT_MAX_UTIL,
    nnodes: int = 1,
    node_rank: int = 0,
    cpu_affinity: str = "auto",
    share: bool = False,
) -> Request:
    """The Request for these option values (as typed on the command line); raises UsageError for bad syntax."""
    return Request(
        nproc=nproc,
        gpus=gpus,
        exclude=exclude,
        gpus_per_proc=gpus_per_proc,
        isolation=isolation,
        cpu=cpu,
        max_used_memory=max_used_memory,
        max_util=max_util,
        nnodes=nnodes,
        node_rank=node_rank,
        cpu_affinity=cpu_affinity,
        share=share,
    )
