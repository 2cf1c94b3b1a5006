"""Errors a user can cause. The CLI prints them without a traceback and exits 2; bugs keep their traceback."""

from __future__ import annotations


class DdpbootError(Exception):
    """A problem the user can fix: bad input, an impossible plan, a program that cannot start, a rank's environment
    that contradicts itself. The launcher raises it before anything starts, or kills what it started first (a rank
    that cannot exec), and exits with `exit_code`; inside a rank the worker API raises its subclasses."""

    exit_code = 2


class UsageError(DdpbootError):
    """Malformed or contradictory options."""


class PlanError(DdpbootError):
    """The request cannot be satisfied on this machine."""


class InventoryError(DdpbootError):
    """The GPU inventory could not be read as given (e.g. a malformed DDPBOOT_FAKE_GPUS)."""


class VisibilityError(DdpbootError):
    """An inherited CUDA_VISIBLE_DEVICES that CUDA itself would reject."""


class WorkerEnvError(DdpbootError):
    """The worker's environment (RANK, WORLD_SIZE, ...) is missing or contradictory."""


class WorkerSetupError(DdpbootError):
    """The worker API was called wrongly: an unknown backend, wrap() on something that is not a module, a second
    init() that contradicts the first."""


class NotInitializedError(WorkerSetupError):
    """A helper that needs the ranks (context(), wrap(), sampler(), barrier(), ...) ran before ddpboot.init()."""


class PitfallError(DdpbootError):
    """A pitfall guard fired and ddpboot.init(strict=True) asked for an error instead of a DdpbootWarning."""


class VisibleDevicesChangedError(PitfallError):
    """CUDA_VISIBLE_DEVICES no longer names the GPUs the ddpboot launcher assigned to this rank."""


class CudaInitializedEarlyError(PitfallError):
    """CUDA was initialised (on another GPU, or before CUDA_VISIBLE_DEVICES could be narrowed) before init()."""


class UnassignedGpuError(PitfallError):
    """CUDA shows this rank GPUs that the ddpboot launcher did not assign to it."""


class ModelDeviceError(PitfallError):
    """wrap() got a model whose parameters live on a CUDA device other than this rank's."""
