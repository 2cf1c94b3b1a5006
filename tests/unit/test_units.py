import pytest

from ddpboot.errors import UsageError
from ddpboot.units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("1024", 1024), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("3 kb", 3000)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "1.2.3", "-5", "12 parsecs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="not a size"):
        parse_size(text, "--max-used-memory")


def test_format_size() -> None:
    assert format_size(0) == "0 B"
    assert format_size(1536 * 2**20) == "1.5 GiB"
    assert format_size(None) == "?"
