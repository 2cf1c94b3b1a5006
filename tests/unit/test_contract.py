"""contract.Choice, the base of every closed set of words, and contract.Isolation: the one place that says what
each isolation mode means for a worker."""

from __future__ import annotations

import json

import pytest

from ddpboot.contract import Choice, Isolation


class Colour(Choice):
    RED = "red", "the default"
    GREEN = "green"
    DEEP_BLUE = "deep-blue", "a colour of two words"


def test_a_choice_is_its_words_in_order_each_a_string() -> None:
    assert Colour.values() == ("red", "green", "deep-blue")
    assert Colour.RED == "red" and str(Colour.DEEP_BLUE) == "deep-blue" and f"{Colour.GREEN}" == "green"
    assert json.dumps({"c": Colour.RED}) == '{"c": "red"}' and Colour.RED.about == "the default"
    assert Colour.GREEN.about == ""


def test_a_word_is_read_in_any_case_and_a_refusal_names_where_it_came_from_and_every_word() -> None:
    assert Colour.parse(" Deep-Blue ", "--colour") is Colour.DEEP_BLUE
    with pytest.raises(ValueError, match=r"^--colour 'blue': choose red \(the default\), green or deep-blue "
                       r"\(a colour of two words\)\.$"):
        Colour.parse("blue", "--colour")
    with pytest.raises(ValueError, match=r"^COLOUR=None: choose"):
        Colour.parse(None, "COLOUR")


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
