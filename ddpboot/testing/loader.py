"""Import a test file inside a rank (or the session server) as pytest does: under pytest's module name, with
pytest's assertion rewriting, so that a failing `assert a == b` in a rank reports both values.

The file's directories come first on sys.path as in the pytest process (the caller passes them), so that its own
imports and the classes its pickled parameters refer to resolve the same way there and here.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Sequence
from pathlib import Path


def extend_path(entries: Sequence[str]) -> None:
    """Put the pytest process's sys.path entries that this process lacks in front, in their order."""
    missing = [e for e in entries if e not in sys.path]
    sys.path[:0] = missing


def load_test_module(path: str, name: str) -> types.ModuleType:
    """The module `name` from `path`, assertions rewritten; the one already imported from that file if any."""
    known = sys.modules.get(name)
    if known is not None and getattr(known, "__file__", None) == path:
        return known
    from _pytest.assertion.rewrite import rewrite_asserts

    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)
    rewrite_asserts(tree, source, path)
    code = compile(tree, path, "exec", dont_inherit=True)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
