"""contract.Isolation: the one place that says what each isolation mode means for a worker."""

from __future__ import annotations

import pytest

from ddpboot.contract import Isolation


def test_parse_takes_any_case_and_names_where_the_bad_value_came_from() -> None:
    assert Isolation.parse(" Rank ") is Isolation.RANK and Isolation.parse("node") is Isolation.NODE
    with pytest.raises(ValueError, match=r"^--isolation 'gpu': choose rank .* or node"):
        Isolation.parse("gpu")
    with pytest.raises(ValueError, match=r"^DDPBOOT_ISOLATION='': choose"):
        Isolation.parse("", where="DDPBOOT_ISOLATION")


@pytest.mark.parametrize(("mode", "visible", "first", "local_rank"), [
    (Isolation.RANK, "GPU-b,GPU-c", 0, 0),
    (Isolation.NODE, "GPU-a,GPU-b,GPU-c,GPU-d", 2, 1),
])
def test_each_mode_decides_what_a_worker_sees_and_is_told(mode: Isolation, visible: str, first: int,
                                                          local_rank: int) -> None:
    # local rank 1 with 2 GPUs per rank, on a node that selected four
    assert mode.visible_devices(["GPU-b", "GPU-c"], ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]) == visible
    assert mode.first_device(1, 2) == first
    assert mode.exported_local_rank(1) == local_rank
    assert mode.own_gpus_only is (mode is Isolation.RANK)
