"""The suite docs/ci.md shows (its ```python blocks that begin with `# NAME.py`) is run as written, with pytester:
what the page promises a CI author is what the plugin does."""

from __future__ import annotations

import re

import pytest

from ddpboot.selection.inventory import load_inventory
from tests.support import REPO

pytest_plugins = ["pytester"]
_BLOCK = re.compile(r"^```python\n# (\w+\.py)\n(.*?)^```", re.S | re.M)


def test_the_documented_suite_runs(pytester: pytest.Pytester) -> None:
    files = dict(_BLOCK.findall((REPO / "docs" / "ci.md").read_text()))
    assert set(files) == {"conftest.py", "test_collectives.py"}
    for name, text in files.items():
        pytester.path.joinpath(name).write_text(text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rs", "--timeout", "240")
    gpus = len(load_inventory().units())
    result.assert_outcomes(passed=8 + (gpus >= 2), skipped=int(gpus < 2))
    result.stdout.fnmatch_lines_random(["*test_all_reduce?nproc=1-float32? PASSED*",
                                        "*test_all_reduce?nproc=4-int64? PASSED*"])
