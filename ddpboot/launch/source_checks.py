"""What a training script's own source says about the GPUs it expects, read before the start (never imported).

Rank isolation (the default) gives each rank only its own GPU(s), so `torch.cuda.device_count()` answers 1 in every
rank. Published examples often start with `if torch.cuda.device_count() < world_size: exit()`: under rank isolation
such a script would print its complaint on every rank and exit 0 having trained nothing. The launcher says so, in
one line, before it starts the ranks.
"""

from __future__ import annotations

import re
from pathlib import Path

from ddpboot.launch.spec import Target
from ddpboot.selection.planner import Plan
from ddpboot.units import plural

DEVICE_COUNT_CALL = re.compile(r"\b(?:torch\.)?(?:cuda|accelerator)\.device_count\s*\(")
"""`torch.cuda.device_count()`, `torch.accelerator.device_count()` (and `cuda.device_count()` after an import)."""


def script_file(target: Target, cwd: Path) -> Path | None:
    """The file python will run for a script target (a directory runs its __main__.py); None for modules and
    programs."""
    if target.kind not in ("script", "run_path"):
        return None
    path = Path(target.name)
    path = path if path.is_absolute() else cwd / path
    return path / "__main__.py" if path.is_dir() else path


def device_count_checks(source: str) -> list[tuple[int, str]]:
    """(line number, line) of each line that calls a device_count(), comments left out."""
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if DEVICE_COUNT_CALL.search(code):
            found.append((number, code.strip()))
    return found


def isolation_note(plan: Plan, target: Target, cwd: Path) -> str | None:
    """The line to print when the script counts GPUs and rank isolation makes it see fewer than the node has."""
    counts = plan.gpus_hidden_by_isolation()
    path = script_file(target, cwd)
    if counts is None or path is None:
        return None
    per_rank, selected = counts
    try:
        checks = device_count_checks(path.read_text(errors="replace"))
    except OSError:
        return None
    if not checks:
        return None
    number, line = checks[0]
    own = "GPU" if per_rank == 1 else plural(per_rank, "GPU")
    return (
        f"{target.name}:{number} counts GPUs (`{line}`); under --isolation rank each rank sees only its own {own}, "
        f"so that count is {per_rank} in every rank, not {selected}. If the script needs to see every selected GPU, "
        "run it with --isolation node."
    )
