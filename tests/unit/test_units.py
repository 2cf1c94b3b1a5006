"""Quantities as people write and read them: byte sizes and counted nouns."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import UsageError
from ddpboot.units import OptionChoice, format_size, parse_size, plural


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1024", 1024), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("3 kb", 3000)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "1.2.3", "-5", "12 parsecs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError, match=r"--max-used-memory .* is not a size"):
        parse_size(text, "--max-used-memory")


@given(st.integers(0, 2**12), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "kb", "MB", "g"]))
def test_parse_size_any_unit(n: int, unit: str) -> None:
    scale = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6}
    assert parse_size(f"{n}{unit}") == n * scale.get(unit.lower(), 10**9)


def test_format_size() -> None:
    assert format_size(0) == "0 B"
    assert format_size(1536 * 2**20) == "1.5 GiB"
    assert format_size(None) == "?"
    assert format_size(1023) == "1023 B" and format_size(2048) == "2 KiB" and format_size(5 * 2**50) == "5120.0 TiB"


def test_plural() -> None:
    assert [plural(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]


class Mode(OptionChoice):
    ON = "on"
    OFF = "off"


def test_an_options_word_it_does_not_know_is_a_usage_error() -> None:
    assert Mode.parse("ON", "--mode") is Mode.ON
    with pytest.raises(UsageError, match=r"^--mode 'maybe': choose on or off\.$"):
        Mode.parse("maybe", "--mode")
