"""`import ddpboot` stays light (no torch) and hands out the worker API's objects on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ddpboot
from ddpboot import worker


def test_import_ddpboot_does_not_import_torch() -> None:
    code = (
        "import sys, ddpboot\n"
        "assert 'torch' not in sys.modules, 'import ddpboot loaded torch'\n"
        "assert 'ddpboot.worker' not in sys.modules\n"
        "print(ddpboot.__version__, sorted(n for n in ddpboot.__all__ if n != '__version__'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0.1.0 ")
    for name in ("init", "wrap", "shutdown", "barrier", "is_main", "main_first", "print0", "sampler", "context"):
        assert f"'{name}'" in out.stdout


def test_lazy_exports_are_the_worker_objects() -> None:
    assert ddpboot.init is worker.init and ddpboot.Context is worker.Context
    assert issubclass(ddpboot.DdpbootWarning, UserWarning)
    without_torch = ("__version__", "DdpbootError", "PitfallError")
    assert set(worker.__all__) == {n for n in ddpboot.__all__ if n not in without_torch}
    assert all(getattr(ddpboot, n) is getattr(worker, n) for n in worker.__all__)
    # the errors a script catches (init(strict=True) raises a PitfallError) come without torch
    from ddpboot.errors import DdpbootError, PitfallError

    assert ddpboot.PitfallError is PitfallError and ddpboot.DdpbootError is DdpbootError
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ddpboot.nope  # noqa: B018
