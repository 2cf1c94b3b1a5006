"""The worker side of ddpboot: `init()`, `wrap()`, the small helpers a DDP script needs, and the pitfall guards.

    ctx = ddpboot.init()                   # ranks, device, process group: whoever started this process
    model = ddpboot.wrap(MyModel())        # on ctx.device, inside DistributedDataParallel when world_size > 1
    loader = DataLoader(ds, batch_size=64, sampler=ddpboot.sampler(ds))

Who started the process decides where the ranks come from: `ddpboot.cluster.detect_environment` picks one
environment class per launcher (`ctx.launcher` is its name), and init() asks that object everything
launcher-specific. The launchers known today:

- **the ddpboot launcher** (`"ddpboot"`): torchrun's environment contract plus `DDPBOOT_LOCAL_RANK` (the
  true node-local index), `DDPBOOT_GPU_UUIDS` (the GPUs the launcher assigned to this rank) and `DDPBOOT_ISOLATION`.
  Under rank isolation (the default) `CUDA_VISIBLE_DEVICES` names only this rank's GPU, so the device is `cuda:0`
  and the exported `LOCAL_RANK` is 0; under node isolation the process sees the node's list and uses
  `cuda:LOCAL_RANK`.
- **torchrun** (`"torchrun"`): the device is `cuda:LOCAL_RANK` (or `cuda:0` when only one GPU is visible, as with
  `--virtual-local-rank` or a per-process CUDA_VISIBLE_DEVICES).
- **srun, one task per GPU** (`"slurm"`): ranks come from SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS, the master
  address from the first host of SLURM_STEP_NODELIST and the port from the job and step ids
  (`ddpboot.cluster.derive_port`; MASTER_PORT wins when set). When the task sees
  the whole node's GPUs (and `--gpus-per-task` was not given), init() narrows CUDA_VISIBLE_DEVICES to the task's own
  GPU *before CUDA initialises* (setting CUDA_DEVICE_ORDER=PCI_BUS_ID first when unset, so an index means the GPU
  nvidia-smi shows under it). It then exports the torchrun contract -- MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE -- and joins with `init_method="env://"`, exactly the
  path torchrun workers take; code that reads those variables after init() (and processes the script starts) see
  the same values. As under ddpboot's rank isolation, the exported LOCAL_RANK is the index of the task's GPU among
  those it sees (0 once narrowed); `ctx.local_rank` and SLURM_LOCALID keep the true index. Worker rank 0 hosts the
  TCPStore (an inherited TORCHELASTIC_USE_AGENT_STORE is dropped: there is no agent under srun).
- **MPI, jsrun, pbsdsh, a bare env:// launch** (`"mpi"`, `"lsf"`, `"pbs"`, `"env"`): ranks from each launcher's own
  variables (docs/clusters.md has the table); like srun, init() narrows CUDA_VISIBLE_DEVICES where a rank sees its
  node's GPUs and exports the torchrun contract. A bare env:// launch (RANK, WORLD_SIZE, MASTER_* only) is one
  process per node, and init() says so with one DdpbootWarning.
- **plain python** (`"none"`): a world of one. No process group is created (`ctx.backend is None`); every helper
  still works (`wrap` returns the moved model, `barrier` returns at once, `sampler` gives a one-replica sampler).
  A process group the script created itself before init() (mp.spawn style) is adopted, its ranks on one node.

Another launcher is one new `ddpboot.cluster.ClusterEnvironment` subclass, declared as an entry point of the
group `ddpboot.environments` (`ddpboot.cluster.plugins`) or passed as `init(environment=...)`; nothing here
changes. The modules: `start` (init), `device` (which GPU), `guards` (the pitfall warnings), `backend`, `helpers`
(wrap, sampler, barrier, ...), `context` (the Context and shutdown) and `exiting` (what runs at interpreter exit).

Pitfall guards warn with `DdpbootWarning` (or raise a `PitfallError` subclass under `init(strict=True)`); each
message says what happened and the one-line fix:

- CUDA_VISIBLE_DEVICES no longer equals what the ddpboot launcher set (under rank isolation, exactly the comma-joined
  `DDPBOOT_GPU_UUIDS`): the script changed it, and this rank may now share a GPU with another.
- CUDA was initialised before init() on a GPU other than this rank's (or, under srun, before the task's
  CUDA_VISIBLE_DEVICES could be narrowed).
- CUDA shows this rank GPUs the launcher did not assign to it (UUIDs compared with `DDPBOOT_GPU_UUIDS`).
- `wrap()` got a model with parameters or buffers on another CUDA device (CPU -> GPU is the normal case: silent).

`torch.load` without `map_location` restores each tensor onto the device it was saved from (typically `cuda:0`
of the saving process); `ddpboot.load` defaults `map_location` to this rank's device instead.
"""

from ddpboot.worker.context import Context, context, shutdown
from ddpboot.worker.guards import DdpbootWarning
from ddpboot.worker.helpers import barrier, is_main, load, main_first, print0, sampler, wrap
from ddpboot.worker.start import init

__all__ = [
    "Context",
    "DdpbootWarning",
    "barrier",
    "context",
    "init",
    "is_main",
    "load",
    "main_first",
    "print0",
    "sampler",
    "shutdown",
    "wrap",
]
