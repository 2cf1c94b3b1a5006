"""CUDA_VISIBLE_DEVICES is read as CUDA reads it (the list is cut at the first invalid entry or past-the-end index,
a duplicate is an error), and resolved against an inventory."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import VisibilityError
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.visible import Visible, parse_visible_devices, resolve_visible


def labels(vis: Visible) -> list[str]:
    return [u.label for u in vis.units]


# --- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "entries"),
    [
        (None, None),
        ("", ()),
        ("-1", ()),
        ("0", ("0",)),
        ("1,0", ("1", "0")),
        ("1,foo,0", ("1",)),
        (" 2 , 3", ("2", "3")),
        ("GPU-abc,1", ("GPU-abc", "1")),
        ("MIG-1234", ("MIG-1234",)),
        ("0,-1,1", ("0",)),
        ("1a,0", ()),
        ("GPU-", ()),
        ("0,", ("0",)),
    ],
)
def test_parse_cuts_at_first_invalid(value: str | None, entries: tuple[str, ...] | None) -> None:
    assert parse_visible_devices(value) == entries


valid_token = st.one_of(
    st.integers(0, 64).map(str),
    st.from_regex(r"GPU-[0-9a-f]{1,8}", fullmatch=True),
    st.from_regex(r"MIG-[0-9a-f]{1,8}", fullmatch=True),
)
invalid_token = st.sampled_from(["", "-1", "foo", "1a", "GPU-", "gpu0", "0x1", "+", "1.0"])


@given(st.lists(valid_token, max_size=6), invalid_token, st.lists(st.one_of(valid_token, invalid_token), max_size=4))
def test_parse_is_the_valid_prefix(head: list[str], bad: str, tail: list[str]) -> None:
    value = ",".join([*head, bad, *tail])
    assert parse_visible_devices(value) == tuple(head)


@given(st.lists(valid_token, min_size=1, max_size=8))
def test_parse_keeps_an_all_valid_list_whole_and_ordered(tokens: list[str]) -> None:
    assert parse_visible_devices(",".join(tokens)) == tuple(tokens)


# --- resolution ------------------------------------------------------------------------------------

INV2 = fake_inventory("2")
INV8 = fake_inventory("8")


def test_unset_means_every_gpu() -> None:
    vis = resolve_visible(INV8, {})
    assert not vis.restricted and labels(vis) == [str(i) for i in range(8)]


def test_indices_keep_cvd_order() -> None:
    assert labels(resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "5,2,7"})) == ["5", "2", "7"]


def test_index_past_the_end_cuts_the_list() -> None:
    vis = resolve_visible(INV2, {"CUDA_VISIBLE_DEVICES": "7,0"})  # CUDA shows 0 devices on a 2-GPU machine
    assert labels(vis) == []
    assert any("index 7 does not exist" in n for n in vis.notes)
    assert labels(resolve_visible(INV2, {"CUDA_VISIBLE_DEVICES": "1,7,0"})) == ["1"]


@pytest.mark.parametrize("value", ["", "-1"])
def test_hide_everything(value: str) -> None:
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": value})
    assert vis.restricted and labels(vis) == []


def test_uuid_prefixes_resolve() -> None:
    g3 = INV8.gpus[3]
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": f"{g3.uuid[:10]},1"})
    assert labels(vis) == ["3", "1"]


def test_unknown_uuid_cuts() -> None:
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "2,GPU-ffffffff-no,3"})
    assert labels(vis) == ["2"]


@pytest.mark.parametrize("value", ["0,0", "1,0,1"])
def test_duplicate_index_is_an_error(value: str) -> None:
    with pytest.raises(VisibilityError, match="twice"):
        resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": value})


def test_duplicate_by_uuid_and_index_is_an_error() -> None:
    with pytest.raises(VisibilityError, match="twice"):
        resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": f"4,{INV8.gpus[4].uuid}"})


def test_duplicate_after_the_cut_does_not_count() -> None:
    assert labels(resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "0,foo,0"})) == ["0"]


def test_ambiguous_uuid_prefix_is_an_error() -> None:
    gpus = tuple(GPU(i, f"GPU-abcd{i}000-0000", f"00000000:{i + 1:02X}:00.0", "X", 10, 0) for i in range(2))
    with pytest.raises(VisibilityError, match="ambiguous"):
        resolve_visible(Inventory(gpus, "fake"), {"CUDA_VISIBLE_DEVICES": "GPU-abcd"})


def test_mixed_models_without_pci_order_is_flagged() -> None:
    gpus = (
        GPU(0, "GPU-aaaa", "00000000:01:00.0", "NVIDIA A100", 10, 0),
        GPU(1, "GPU-bbbb", "00000000:02:00.0", "NVIDIA T4", 10, 0),
    )
    inv = Inventory(gpus, "fake")
    vis = resolve_visible(inv, {"CUDA_VISIBLE_DEVICES": "1"})
    assert labels(vis) == ["1"]
    assert any("FASTEST_FIRST" in n for n in vis.notes)
    quiet = resolve_visible(inv, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert quiet.notes == ()
    assert resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "1"}).notes == ()  # one model: the orders agree


def test_slurm_cgroup_local_indices_map_to_global_gpus() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,6"}
    vis = resolve_visible(INV8, env)
    assert labels(vis) == ["4", "6"]
    assert any("SLURM" in n for n in vis.notes)


def test_slurm_global_indices_are_taken_as_they_are() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,6", "SLURM_JOB_GPUS": "4,6"}
    assert labels(resolve_visible(INV8, env)) == ["4", "6"]
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}
    assert labels(resolve_visible(INV8, env)) == ["0", "1"]


def mig_inventory() -> Inventory:
    parent = GPU(0, "GPU-0000aaaa", "00000000:01:00.0", "A100", 80, 0)
    migs = tuple(
        GPU(0, f"MIG-{j}{j}{j}{j}cccc", parent.pci_bus_id, "A100 MIG 3g", 40, 0, mig_index=j) for j in range(2)
    )
    mig_parent = GPU(**{**parent.__dict__, "mig_devices": migs})
    plain = GPU(1, "GPU-1111bbbb", "00000000:02:00.0", "A100", 80, 0)
    return Inventory((mig_parent, plain), "fake")


def test_mig_units_and_uuids() -> None:
    inv = mig_inventory()
    assert [u.label for u in inv.units()] == ["0:0", "0:1", "1"]
    assert labels(resolve_visible(inv, {"CUDA_VISIBLE_DEVICES": "MIG-1111"})) == ["0:1"]
    assert labels(resolve_visible(inv, {"CUDA_VISIBLE_DEVICES": "0"})) == ["0:0", "0:1"]


@given(st.permutations(list(range(8))), st.integers(0, 8))
def test_any_subset_of_indices_resolves_in_order(perm: list[int], n: int) -> None:
    chosen = perm[:n]
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, chosen))})
    assert [u.index for u in vis.units] == chosen
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", u.uuid) for u in vis.units)


def test_describe_and_allows() -> None:
    assert resolve_visible(INV8, {}).describe() == "all GPUs"
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "3,1"})
    assert vis.describe() == "CUDA_VISIBLE_DEVICES='3,1' allows 3, 1"
    assert vis.allows(INV8.gpus[1]) and not vis.allows(INV8.gpus[0])
    assert resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": ""}).describe() == "CUDA_VISIBLE_DEVICES='' allows none"


def test_a_cut_list_is_noted() -> None:
    vis = resolve_visible(INV8, {"CUDA_VISIBLE_DEVICES": "1,foo,0"})
    assert labels(vis) == ["1"]
    assert vis.notes == (
        "CUDA_VISIBLE_DEVICES='1,foo,0': CUDA stops reading at the invalid entry 'foo', so only 1 entry count",
    )


def test_the_worker_can_read_cvd_without_the_inventory() -> None:
    """Every rank imports visible.py (through the worker API); NVML's inventory must not come with it."""
    code = (
        "import sys; import ddpboot.selection.visible as v; assert v.parse_visible_devices('0') == ('0',); "
        "print(sorted(m for m in sys.modules if m.startswith('ddpboot.selection')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "['ddpboot.selection', 'ddpboot.selection.visible']"
