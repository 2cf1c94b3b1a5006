"""The benchmark cases run by benchmarks/run.py; one module per subject, each case a function Bench → CaseResult."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cli import case_cli
from .common import Bench, CaseResult
from .gpu import case_busbw, case_isolation
from .launch import case_launch, case_launch_nccl
from .resources import case_resources
from .teardown import case_teardown
from .train import case_train, case_train_gpu


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Bench], CaseResult]
    min_gpus: int  # 0: runs everywhere
    what: str


CASES = [
    Case("launch", case_launch, 0, "2-rank and 1-rank gloo init + all_reduce → exit, and the bare-worker floor"),
    Case("teardown", case_teardown, 0, "a rank exits 3 → launcher exit, sibling obeys / ignores SIGTERM"),
    Case("resources", case_resources, 0, "launcher (+ guardian) peak RSS and CPU time while a job runs"),
    Case("cli", case_cli, 0, "`ddpboot plan` / `ddpboot gpus` wall time, torch import check"),
    Case("train", case_train, 0, "examples/train.py steps/s, 2 gloo ranks"),
    Case("launch-nccl", case_launch_nccl, 1, "NCCL init + all_reduce → exit (2 ranks where 2 GPUs), bare floor"),
    Case("train-gpu", case_train_gpu, 2, "examples/train.py steps/s, 2 NCCL ranks"),
    Case("busbw", case_busbw, 2, "NCCL all_reduce busbw 1 MiB … 1 GiB bf16, --isolation rank vs node"),
    Case("isolation", case_isolation, 2, "GPU 0 memory while a job runs on GPU 1: ddpboot vs classic torchrun"),
]
