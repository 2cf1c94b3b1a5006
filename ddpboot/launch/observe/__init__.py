"""Everything that watches a running job, in one room. Each observer is one module with one class (base.py says
what an observer is and which hooks the attempt loop calls) and one line in OBSERVERS:

- watch.py: the launcher's watch hook (the node link: another node failed; an elastic round: a node waits);
- gpuwatch.py: `--gpu-watch`, whose process is on which GPU, and the GPUs' health;
- stall.py: `--stall-timeout`, no output, no exit, no busy CPU, the same stacks;
- dstate.py: a rank stuck in the kernel (D state) while the job runs, TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT;
- death.py: why a rank died by a signal (the OOM killer, a limit, another process; why.py decides, memcg.py reads
  the memory cgroups);
- startup.py: the start-up waterfall, each rank's phases and the one slow rank (waterfall.py decides);
- straggler.py: `--straggler-window`, a rank slower than the others, named while the job runs;
- stacks/: the stack dumps and their verdict, whenever the decisions ask (and `ddpboot stacks`, finding a job);
- status.py: status.json, what `ddpboot top` reads (sample.py: top's readings of the processes and GPUs).
"""

from __future__ import annotations

from collections.abc import Callable

from ddpboot.launch.observe.base import Job, Observer
from ddpboot.launch.observe.death import DeathCause
from ddpboot.launch.observe.dstate import Uninterruptible
from ddpboot.launch.observe.gpuwatch import GpuWatch
from ddpboot.launch.observe.stacks.dump import StackDumps
from ddpboot.launch.observe.stall import Stall
from ddpboot.launch.observe.startup import Startup
from ddpboot.launch.observe.status import RunStatus
from ddpboot.launch.observe.straggler import Stragglers
from ddpboot.launch.observe.watch import WatchHook

__all__ = ["OBSERVERS", "Job", "Observer", "start"]

OBSERVERS: tuple[Callable[[Job], Observer | None], ...] = (
    WatchHook.start,
    GpuWatch.start,
    Stall.start,
    StackDumps.start,
    Uninterruptible.start,  # after the dumps: its verdict line follows theirs
    DeathCause.start,
    Startup.start,
    Stragglers.start,
    RunStatus.start,  # last: it publishes what the others changed
)
"""Who watches an attempt, in the order the loop asks them; each returns its observer, or None when it has nothing
to watch in this job (the option is off, the job has no GPU)."""


def start(job: Job) -> list[Observer]:
    """The observers of one attempt."""
    return [o for make in OBSERVERS if (o := make(job)) is not None]
