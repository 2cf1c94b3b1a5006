"""Backend names: checked against torch.distributed's list before anything starts."""

from __future__ import annotations

import pytest

from ddpboot.errors import WorkerSetupError
from ddpboot.worker.backend import normalize_backend


@pytest.mark.parametrize(
    ("given", "expected"),
    [("gloo", "gloo"), (" NCCL ", "nccl"), ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"), ("mpi", "mpi")],
)
def test_normalize_backend_accepts_torch_names(given: str, expected: str) -> None:
    assert normalize_backend(given) == expected


@pytest.mark.parametrize("bad", ["ncl", "", "  ", "tpu:gloo", "cpu:nope", "undefined", 3, None])
def test_normalize_backend_rejects_unknown(bad: object) -> None:
    with pytest.raises(WorkerSetupError, match="Fix: pass backend=None") as exc:
        normalize_backend(bad)
    assert repr(bad) in str(exc.value)
