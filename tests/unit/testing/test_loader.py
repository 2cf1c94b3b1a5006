"""A test file imported in a rank as pytest imports it: its name, and assertions that report their values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpboot.testing.loader import extend_path, load_test_module


def test_assertions_are_rewritten_and_the_module_is_reused(tmp_path: Path) -> None:
    path = tmp_path / "test_mod_for_loader.py"
    path.write_text("def check(a):\n    b = [1, 2]\n    assert a == b\n")
    name = "pkg_for_loader.test_mod_for_loader"
    try:
        module = load_test_module(str(path), name)
        with pytest.raises(AssertionError) as err:
            module.check([1, 3])
        assert "assert [1, 3] == [1, 2]" in str(err.value)
        assert load_test_module(str(path), name) is module
        assert sys.modules[name] is module
    finally:
        sys.modules.pop(name, None)


def test_a_module_that_fails_to_import_is_not_left_behind(tmp_path: Path) -> None:
    path = tmp_path / "test_broken_for_loader.py"
    path.write_text("raise ImportError('no such thing')\n")
    with pytest.raises(ImportError):
        load_test_module(str(path), "test_broken_for_loader")
    assert "test_broken_for_loader" not in sys.modules


def test_extend_path_puts_missing_entries_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", ["/b", "/c"])
    extend_path(["/a", "/b", "/z"])
    assert sys.path == ["/a", "/z", "/b", "/c"]
