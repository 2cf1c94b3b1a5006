"""The planner on simulated 1-, 2-, 8- and 16-GPU machines, and every bad input it must refuse."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import DdpbootError, PlanError, UsageError
from ddpboot.selection.inventory import GPU, Inventory, fake_inventory
from ddpboot.selection.planner import Plan, Request, make_plan, parse_gpu_list

GIB = 1024**3
NONE = Inventory((), "none", ("no NVIDIA driver found",))


def machine(n: int, busy: dict[int, dict[str, Any]] | None = None) -> Inventory:
    """n idle 80 GiB GPUs; `busy` overrides fields per index (memory_used, utilization, processes)."""
    base = fake_inventory(str(n))
    gpus = [GPU(**{**g.__dict__, **(busy or {}).get(g.index, {})}) for g in base.gpus]
    return Inventory(tuple(gpus), "fake")


def indices(plan: Plan) -> list[list[str]]:
    return [[g.label for g in r.gpus] for r in plan.ranks]


def plan(inv: Inventory, env: dict[str, str] | None = None, cpu_count: int = 4, **req: Any) -> Plan:
    return make_plan(Request(**req), inv, env or {}, cpu_count=cpu_count)


# --- choosing GPUs ---------------------------------------------------------------------------------


def test_default_is_one_rank_on_the_first_free_gpu() -> None:
    p = plan(machine(8))
    assert indices(p) == [["0"]] and p.world_size == 1 and p.backend == "nccl"


def test_headline_four_ranks_excluding_gpu0() -> None:
    p = plan(machine(8), nproc="4", exclude="0")
    assert indices(p) == [["1"], ["2"], ["3"], ["4"]]
    for slot in p.ranks:
        assert slot.cuda_visible_devices == slot.gpus[0].uuid  # rank isolation: only its own GPU
        assert slot.device == "cuda:0"
    assert [s.rank for s in p.ranks] == [0, 1, 2, 3]


def test_one_gpu_machine() -> None:
    assert indices(plan(machine(1), nproc="1")) == [["0"]]
    with pytest.raises(PlanError, match="need 2 free GPUs"):
        plan(machine(1), nproc="2")


def test_busy_gpus_are_skipped_and_named_when_short() -> None:
    inv = machine(8, {0: {"memory_used": 40 * GIB}, 3: {"utilization": 80}, 5: {"processes": (123,)}})
    assert indices(plan(inv, nproc="4")) == [["1"], ["2"], ["4"], ["6"]]
    with pytest.raises(PlanError) as err:
        plan(inv, nproc="6")
    msg = str(err.value)
    assert "need 6 free GPUs" in msg and "only 5 are free" in msg
    assert "0 (40.0 GiB used" in msg and "3 (80% busy" in msg and "5 (1 process running)" in msg


def test_thresholds_are_options() -> None:
    inv = machine(2, {0: {"memory_used": 1 * GIB, "utilization": 20}})
    assert indices(plan(inv, nproc="2", max_used_memory=2 * GIB, max_util=50)) == [["0"], ["1"]]
    with pytest.raises(PlanError):
        plan(inv, nproc="2")


def test_idle_first_then_most_free_memory_then_lowest_index() -> None:
    inv = machine(
        16,
        {
            0: {"memory_used": 100 * 2**20},  # light use: free but not idle
            1: {"memory_used": 10 * 2**20},
            2: {"utilization": 3},
        },
    )
    # 13 idle GPUs (3..15) come first; then the most free memory: 2 (none used), 1 (10 MiB), 0 (100 MiB).
    p = plan(inv, nproc="14")
    assert sorted(int(r.gpus[0].label) for r in p.ranks) == [2, *range(3, 16)]
    assert sorted(int(r.gpus[0].label) for r in plan(inv, nproc="15").ranks) == [1, 2, *range(3, 16)]
    # ranks follow PCI order whatever the preference order was
    assert [int(r.gpus[0].label) for r in p.ranks] == sorted(int(r.gpus[0].label) for r in p.ranks)


def test_selection_is_stable() -> None:
    inv = machine(16, {i: {"memory_used": (i % 3) * 2**20} for i in range(16)})
    assert indices(plan(inv, nproc="5")) == indices(plan(inv, nproc="5"))


def test_explicit_list_keeps_its_order_and_may_name_busy_gpus() -> None:
    inv = machine(8, {5: {"memory_used": 50 * GIB}})
    p = plan(inv, gpus="7,5,3,1")
    assert indices(p) == [["7"], ["5"], ["3"], ["1"]]
    assert any("GPU 5 is busy" in n for n in p.notes)


def test_explicit_list_forms() -> None:
    inv = machine(8)
    g6 = inv.gpus[6]
    assert indices(plan(inv, gpus="0-2")) == [["0"], ["1"], ["2"]]
    assert indices(plan(inv, gpus=g6.uuid[:9])) == [["6"]]
    assert indices(plan(inv, gpus=g6.pci_bus_id)) == [["6"]]
    assert indices(plan(inv, gpus="0000:" + g6.pci_bus_id.split(":", 1)[1].lower())) == [["6"]]


def test_gpus_per_proc() -> None:
    p = plan(machine(8), nproc="2", gpus_per_proc=3, exclude="0")
    assert indices(p) == [["1", "2", "3"], ["4", "5", "6"]]
    assert p.ranks[1].cuda_visible_devices == ",".join(g.uuid for g in p.ranks[1].gpus)
    assert all(r.device == "cuda:0" for r in p.ranks)
    assert indices(plan(machine(4), gpus="3,2,1,0", gpus_per_proc=2)) == [["3", "2"], ["1", "0"]]


def test_node_isolation_gives_every_worker_the_whole_list() -> None:
    p = plan(machine(8), nproc="3", exclude="0", isolation="node")
    everything = ",".join(g.uuid for r in p.ranks for g in r.gpus)
    assert all(r.cuda_visible_devices == everything for r in p.ranks)
    assert [r.device for r in p.ranks] == ["cuda:0", "cuda:1", "cuda:2"]
    p2 = plan(machine(4), nproc="2", gpus_per_proc=2, isolation="node")
    assert [r.device for r in p2.ranks] == ["cuda:0", "cuda:2"]


def test_nproc_gpu_and_auto() -> None:
    inv = machine(8, {2: {"memory_used": 10 * GIB}})
    gpu = plan(inv, nproc="gpu", exclude="7")
    assert len(gpu.ranks) == 7 and any("GPU 2 is busy" in n for n in gpu.notes)
    assert len(plan(inv, nproc="auto").ranks) == 7  # every free GPU
    assert len(plan(inv, nproc="auto", gpus_per_proc=2).ranks) == 3


def test_global_ranks_follow_the_node_rank() -> None:
    p = plan(machine(8), nproc="4", nnodes=3, node_rank=2)
    assert [r.rank for r in p.ranks] == [8, 9, 10, 11] and p.world_size == 12
    assert [r.local_rank for r in p.ranks] == [0, 1, 2, 3]


# --- inherited CUDA_VISIBLE_DEVICES ----------------------------------------------------------------


def test_inherited_indices_limit_the_choice_and_keep_physical_numbering() -> None:
    inv = machine(8)
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert indices(plan(inv, env, nproc="2")) == [["2"], ["3"]]
    assert indices(plan(inv, env, gpus="3")) == [["3"]]
    with pytest.raises(PlanError, match="not visible") as err:
        plan(inv, env, gpus="0")
    assert "physical" in str(err.value) and "2, 3" in str(err.value)
    with pytest.raises(PlanError, match="need 3 free GPUs"):
        plan(inv, env, nproc="3")


def test_inherited_uuids() -> None:
    inv = machine(8)
    env = {"CUDA_VISIBLE_DEVICES": f"{inv.gpus[6].uuid},{inv.gpus[1].uuid[:12]}"}
    assert indices(plan(inv, env, nproc="gpu")) == [["6"], ["1"]]  # CUDA's order: the inherited list's


def test_cvd_hiding_everything_means_cpu_unless_gpus_are_asked_for() -> None:
    inv = machine(8)
    env = {"CUDA_VISIBLE_DEVICES": ""}
    p = plan(inv, env, nproc="2")
    assert p.backend == "gloo" and [r.cuda_visible_devices for r in p.ranks] == ["", ""]
    with pytest.raises(PlanError, match="hides every GPU"):
        plan(inv, env, nproc="gpu")
    with pytest.raises(PlanError, match="not visible"):
        plan(inv, env, gpus="1")


def test_slurm_renumbered_cvd() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,5"}
    assert indices(plan(machine(8), env, nproc="gpu")) == [["4"], ["5"]]


# --- MIG -------------------------------------------------------------------------------------------


def mig_machine() -> Inventory:
    parent = GPU(0, "GPU-0000aaaa", "00000000:01:00.0", "A100", 80 * GIB, 0)
    migs = tuple(
        GPU(0, f"MIG-{j}{j}{j}{j}cccc", parent.pci_bus_id, "A100 MIG 3g", 40 * GIB, 0, mig_index=j) for j in range(2)
    )
    plain = GPU(1, "GPU-1111bbbb", "00000000:02:00.0", "A100", 80 * GIB, 0)
    return Inventory((GPU(**{**parent.__dict__, "mig_devices": migs}), plain), "fake")


def test_mig_instances_are_units() -> None:
    p = plan(mig_machine(), nproc="3")
    assert indices(p) == [["0:0"], ["0:1"], ["1"]]
    assert p.ranks[1].cuda_visible_devices == "MIG-1111cccc"
    assert indices(plan(mig_machine(), gpus="0:1,1")) == [["0:1"], ["1"]]
    assert indices(plan(mig_machine(), nproc="1", exclude="0")) == [["1"]]


# --- CPU -------------------------------------------------------------------------------------------


def test_no_gpus_means_cpu_ranks() -> None:
    p = plan(NONE, nproc="3")
    assert p.backend == "gloo" and len(p.ranks) == 3 and all(not r.gpus and r.device == "cpu" for r in p.ranks)
    assert len(plan(NONE, nproc="auto", cpu_count=5).ranks) == 5
    assert len(plan(machine(2), nproc="cpu", cpu_count=6).ranks) == 6
    assert plan(machine(2), nproc="2", cpu=True).backend == "gloo"


# --- bad input: one clear error each --------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "kind", "match"),
    [
        ({"gpus": "9"}, PlanError, r"GPU 9 does not exist; this machine has 8 GPUs: 0, 1, .*7"),
        ({"gpus": "GPU-ffff"}, PlanError, "no GPU has a UUID starting with 'GPU-ffff'"),
        ({"exclude": "12"}, PlanError, "GPU 12 does not exist"),
        ({"gpus": "1,2", "exclude": "2"}, UsageError, "GPU 2 is both listed in --gpus 1,2 and excluded"),
        ({"nproc": "9"}, PlanError, "need 9 free GPUs, but only 8 are free"),
        ({"nproc": "2", "exclude": "0-7"}, PlanError, "leaves no GPU"),
        ({"gpus": "0,1,2", "gpus_per_proc": 2}, UsageError, "does not divide"),
        ({"nproc": "3", "gpus_per_proc": 3}, PlanError, "3 ranks × 3 GPUs need 9"),
        ({"nproc": "0"}, UsageError, "at least 1"),
        ({"nproc": "-2"}, UsageError, "at least 1"),
        ({"nproc": "four"}, UsageError, "not a process count"),
        ({"gpus": "1,,2"}, UsageError, "entry 2 is empty"),
        ({"gpus": "a-b"}, UsageError, "'a-b' is not a GPU"),
        ({"gpus": "1-"}, UsageError, "'1-' is not a GPU"),
        ({"gpus": "3-1"}, UsageError, "runs backwards"),
        ({"gpus": "1,1"}, UsageError, "more than once"),
        ({"gpus": "0,1", "nproc": "3"}, UsageError, "needs 3 GPUs but --gpus 0,1 names 2"),
        ({"gpus": "1:0"}, PlanError, "MIG instance 1:0 does not exist"),
        ({"gpus": "0000:99:00.0"}, PlanError, "no GPU has PCI bus id"),
        ({"isolation": "numa"}, UsageError, "choose rank"),
        ({"gpus_per_proc": 0}, UsageError, "at least 1 GPU"),
        ({"node_rank": 2, "nnodes": 2}, UsageError, r"outside 0\.\.1"),
        ({"cpu": True, "gpus": "1"}, UsageError, "contradict"),
    ],
)
def test_bad_input(req: dict[str, Any], kind: type[DdpbootError], match: str) -> None:
    with pytest.raises(kind, match=match):
        plan(machine(8), **req)


def test_ambiguous_uuid_prefix() -> None:
    gpus = tuple(GPU(i, f"GPU-abcd{i}-x", f"00000000:{i + 1:02X}:00.0", "X", GIB, 0) for i in range(2))
    with pytest.raises(DdpbootError, match="ambiguous"):
        plan(Inventory(gpus, "fake"), gpus="GPU-abcd")


def test_gpu_requests_on_a_machine_without_gpus() -> None:
    with pytest.raises(PlanError, match="has none"):
        plan(NONE, nproc="gpu")
    with pytest.raises(PlanError, match="does not exist; this machine has no GPUs"):
        plan(NONE, gpus="0")


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
        tokens = parse_gpu_list(text, "--gpus")
        assert len(tokens) == sum(3 if p == "2-4" else 1 for p in parts)


@given(st.integers(1, 16), st.integers(1, 4), st.sets(st.integers(0, 15), max_size=16), st.data())
def test_plans_never_share_a_gpu_and_respect_exclusions(n: int, k: int, excl: set[int], data: Any) -> None:
    inv = machine(16, {i: {"memory_used": data.draw(st.sampled_from([0, 10 * GIB]))} for i in range(16)})
    exclude = ",".join(map(str, sorted(excl))) or None
    try:
        p = plan(inv, nproc=str(n), gpus_per_proc=k, exclude=exclude)
    except PlanError:
        free = [g for g in inv.gpus if g.index not in excl and g.memory_used == 0]
        assert len(free) < n * k
        return
    used = [g.index for r in p.ranks for g in r.gpus]
    assert len(used) == len(set(used)) == n * k
    assert not set(used) & excl
    assert all(inv.gpus[i].memory_used == 0 for i in used)
