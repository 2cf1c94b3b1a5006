"""The GPU lists of --gpus and --exclude: parsed into tokens (syntax only), then resolved against an inventory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import PlanError, UsageError, VisibilityError
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.gpu_list import (
    BusId,
    GpuIndex,
    MigInstance,
    UuidPrefix,
    bus_address,
    parse_gpu_list,
    resolve_list,
)
from ddpboot.selection.inventory import fake_inventory
from tests.support import mig_machine

INV8 = fake_inventory("8")


def labels(text: str, inv: Inventory = INV8) -> list[str]:
    return [u.label for u in resolve_list(parse_gpu_list(text, "--gpus"), inv, "--gpus")]


# --- syntax ----------------------------------------------------------------------------------------


def test_tokens() -> None:
    assert parse_gpu_list(" 2-4 , 1:0,18:00.0,MIG-ab", "--gpus").tokens == (
        GpuIndex("2", 2),
        GpuIndex("3", 3),
        GpuIndex("4", 4),
        MigInstance("1:0", 1, 0),
        BusId("18:00.0", (0, 0x18, 0, 0)),
        UuidPrefix("MIG-ab"),
    )


@pytest.mark.parametrize(
    ("text", "address"),
    [("0000:18:00.0", (0, 0x18, 0, 0)), ("00000001:9A:01.7", (1, 0x9A, 1, 7)), ("18:00.8", None), ("GPU-1", None)],
)
def test_bus_address(text: str, address: tuple[int, int, int, int] | None) -> None:
    assert bus_address(text) == address


@given(
    st.lists(
        st.sampled_from(["1", "2-4", "GPU-ab", "0000:18:00.0", "3:1", "", "a-b", "1-", "x", " 5 "]),
        min_size=1,
        max_size=5,
    )
)
def test_list_parser_accepts_exactly_the_valid_forms(parts: list[str]) -> None:
    text = ",".join(parts)
    bad = [p for p in parts if p.strip() in ("", "a-b", "1-", "x")]
    if bad:
        with pytest.raises(UsageError):
            parse_gpu_list(text, "--gpus")
    else:
        gpus = parse_gpu_list(text, "--gpus")
        assert gpus.text == text
        assert len(gpus.tokens) == sum(3 if p == "2-4" else 1 for p in parts)


@given(st.integers(0, 40), st.integers(0, 40))
def test_ranges_expand_inclusively(lo: int, hi: int) -> None:
    if lo > hi:
        with pytest.raises(UsageError, match="runs backwards"):
            parse_gpu_list(f"{lo}-{hi}", "--exclude")
    else:
        tokens = parse_gpu_list(f"{lo}-{hi}", "--exclude").tokens
        assert tokens == tuple(GpuIndex(str(i), i) for i in range(lo, hi + 1))


# --- resolution ------------------------------------------------------------------------------------


def test_every_form_names_the_same_gpu() -> None:
    g6 = INV8.gpus[6]
    for text in ("6", "6-6", g6.uuid, g6.uuid[:9], g6.pci_bus_id, "0000:" + g6.pci_bus_id.split(":", 1)[1].lower()):
        assert labels(text) == ["6"], text


def test_order_is_kept() -> None:
    assert labels("7,2-3,0") == ["7", "2", "3", "0"]


def test_mig() -> None:
    inv = mig_machine()
    assert labels("0", inv) == ["0:0", "0:1"]  # a MIG-enabled GPU means all its instances
    assert labels("GPU-0000", inv) == ["0:0", "0:1"]
    assert labels("00000000:01:00.0", inv) == ["0:0", "0:1"]
    assert labels("0:1,1", inv) == ["0:1", "1"]
    assert labels("MIG-1111", inv) == ["0:1"]


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("9", PlanError, "--gpus: GPU 9 does not exist; this machine has 8 GPUs: 0, 1, 2, 3, 4, 5, 6, 7. Run"),
        ("GPU-ffff", PlanError, "--gpus: no GPU has a UUID starting with 'GPU-ffff'; this machine has 8 GPUs"),
        ("1:0", PlanError, "--gpus: MIG instance 1:0 does not exist; MIG instances here: none."),
        ("0000:99:00.0", PlanError, "--gpus: no GPU has PCI bus id 0000:99:00.0; bus ids here: 0=00000000:18:00.0"),
        ("1,1", UsageError, "--gpus '1,1' names GPU 1 more than once. List each GPU once."),
        ("2,0-3", UsageError, "--gpus '2,0-3' names GPU 2 more than once."),
    ],
)
def test_refusals(text: str, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as err:
        labels(text)
    assert str(err.value).startswith(message), str(err.value)


def test_a_gpu_named_twice_in_two_spellings() -> None:
    with pytest.raises(UsageError, match="names GPU 3 more than once"):
        labels(f"3,{INV8.gpus[3].uuid[:10]}")
    with pytest.raises(UsageError, match="names GPU 0:1 more than once"):
        labels("0,0:1", mig_machine())


def test_ambiguous_prefix() -> None:
    gpus = tuple(GPU(i, f"GPU-abcd{i}-x", f"00000000:{i + 1:02X}:00.0", "X", 1, 0) for i in range(2))
    with pytest.raises(VisibilityError, match="--gpus: the UUID prefix 'GPU-abcd' is ambiguous"):
        labels("GPU-abcd", Inventory(gpus, "fake"))


def test_nothing_exists_on_a_machine_without_gpus() -> None:
    with pytest.raises(PlanError, match="GPU 0 does not exist; this machine has no GPUs"):
        labels("0", Inventory((), "none"))


@given(st.sets(st.integers(0, 7), min_size=1))
def test_any_set_of_indices_resolves_to_those_gpus(chosen: set[int]) -> None:
    text = ",".join(map(str, sorted(chosen)))
    assert [u.uuid for u in resolve_list(parse_gpu_list(text, "--gpus"), INV8, "--gpus")] == [
        INV8.gpus[i].uuid for i in sorted(chosen)
    ]
