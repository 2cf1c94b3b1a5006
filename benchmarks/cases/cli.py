"""cli: wall time of `ddpboot plan` and `ddpboot gpus`, the commands a user runs to see what a job would get.

They must answer at once: no torch import, NVML only (DESIGN: target under 0.3 s). Measured as a user runs them
(a fresh interpreter each time), next to two references: the bare interpreter (`python -c pass`, the floor) and
`python -c "import torch"` (what a planner importing torch would pay). Whether torch is imported is checked once
with `python -X importtime`. torchrun has no equivalent command.
"""

from __future__ import annotations

import subprocess

from bench_launch import DDPBOOT

from .common import PY, ROOT, Bench, CaseResult, Run, alternate, job_env, run_logged, sec, stats

TARGET_S = 0.3


def imports_torch(cmd: list[str]) -> bool:
    """Whether CMD (a Python program) imports torch, from `python -X importtime` (one line per imported module)."""
    prog = cmd[1:] if cmd[0] == PY else ["-m", "ddpboot", *cmd[len(DDPBOOT):]]
    err = subprocess.run([PY, "-X", "importtime", *prog], env=job_env(), cwd=ROOT, capture_output=True,
                         text=True).stderr
    mods = {ln.rsplit("|", 1)[-1].strip() for ln in err.splitlines() if ln.startswith("import time:")}
    return any(m == "torch" or m.startswith("torch.") for m in mods)


def case_cli(b: Bench) -> CaseResult:
    contenders = {
        "ddpboot gpus": [*DDPBOOT, "gpus"],
        "ddpboot plan --nproc 2": [*DDPBOOT, "plan", "--nproc", "2"],
        "ddpboot plan --nproc 2 --json": [*DDPBOOT, "plan", "--nproc", "2", "--json"],
        "python -c pass (floor)": [PY, "-c", "pass"],
        "python -c 'import torch' (reference)": [PY, "-c", "import torch"],
    }
    runs: dict[str, list[Run]] = {n: [] for n in contenders}
    for name, cmd in contenders.items():
        run_logged(name, cmd, job_env(), -1)
    for i, name in alternate(list(contenders), b.pairs):
        runs[name].append(run_logged(name, contenders[name], job_env(), i))
    rows = []
    for name, cmd in contenders.items():
        walls = [r.wall_s for r in runs[name]]
        torch_note = ("imports torch" if imports_torch(cmd) else "no torch import") if name.startswith("ddpboot") \
            else ""
        rows.append([name, stats(walls, sec), torch_note])
    notes = [f"Target for `ddpboot plan` / `ddpboot gpus`: under {TARGET_S} s (reported, not asserted). "
             f"{b.pairs} alternating rounds after one warm-up run each; a fresh interpreter each run."]
    return CaseResult("cli", "`ddpboot plan` / `ddpboot gpus` wall time", ["command", "wall time", "torch"], rows,
                      notes, {"runs": {n: [r.record() for r in rs] for n, rs in runs.items()}})
