"""The rule both straggler judges share: a rank every sample of a whole window points at is named, once; again only
when another rank is, or when no sample of a window points at it any more."""

from __future__ import annotations

import pytest

from ddpboot.launch.observe.pace import SAMPLES, persistent


@pytest.mark.parametrize(("points", "named", "expected"), [
    ([1] * (SAMPLES - 1), None, (None, None)),  # not a whole window yet
    ([1] * SAMPLES, None, (1, 1)),  # named
    ([0] * SAMPLES, None, (0, 0)),  # rank 0 is a rank like any other
    ([1] * SAMPLES, 1, (None, 1)),  # already named: said once
    ([None, 1, 1, 1, 1], None, (None, None)),  # one sample short
    ([1, 1, 2, 1, 1], None, (None, None)),  # another rank in between
    ([2] * SAMPLES, 1, (2, 2)),  # another rank took over
    ([None, None, 1, None, None], 1, (None, 1)),  # still seen in the window: stays named
    ([None] * SAMPLES, 1, (1, None)),  # a whole window without it: cleared, said once
    ([2, 2, None, 2, 2], 1, (1, None)),  # without it, even if another rank is not yet named
    ([None] * SAMPLES, None, (None, None)),
])
def test_named_once_persistently_and_again_only_on_a_change(points: list[int | None], named: int | None,
                                                            expected: tuple[int | None, int | None]) -> None:
    assert persistent(points, named) == expected
