"""Imported by the session server's fast-start zygote before it forks any rank: torch, ddpboot's worker API, pytest's
assertion rewriting and the session's test files (DDPBOOT_TESTING_PRELOAD, written by the pytest process), so a
rank forked from it starts with all of them imported. A test file that cannot be imported here is left to the
rank, which reports the error as the test's failure."""

from __future__ import annotations

import contextlib
import json
import os

import _pytest.assertion.rewrite  # noqa: F401  (imported here once, for every rank)
import torch
import torch.distributed  # noqa: F401

import ddpboot.worker  # noqa: F401  (what ddpboot.init() loads on first use)
from ddpboot.testing import rank  # noqa: F401
from ddpboot.testing.job import PRELOAD_VAR
from ddpboot.testing.loader import extend_path, load_test_module


def _preload() -> None:
    spec = json.loads(os.environ.get(PRELOAD_VAR) or "{}")
    extend_path(spec.get("sys_path", []))
    for module, path in spec.get("modules", []):
        with contextlib.suppress(Exception):
            load_test_module(path, module)


_preload()
