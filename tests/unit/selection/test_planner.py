"""The planner on simulated 1-, 2-, 8- and 16-GPU machines, and every request it must refuse.

Requests are built as the command line builds them (`parse_request` with the options as typed), so each bad input
is checked end to end: syntax errors from the parser, impossible plans from the planner."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.errors import DdpbootError, PlanError, UsageError
from ddpboot.selection.gpu import GPU, Inventory
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import FAILING_NOTE, GpusBusy, Plan, busy_reasons, make_plan
from ddpboot.selection.request import parse_request
from tests.support import GIB, mig_machine

NONE = Inventory((), "none", ("no NVIDIA driver found",))


def machine(n: int, busy: dict[int, dict[str, Any]] | None = None) -> Inventory:
    """n idle 80 GiB GPUs; `busy` overrides fields per index (memory_used, utilization, processes)."""
    base = fake_inventory(str(n))
    gpus = [GPU(**{**g.__dict__, **(busy or {}).get(g.index, {})}) for g in base.gpus]
    return Inventory(tuple(gpus), "fake")


def indices(plan: Plan) -> list[list[str]]:
    return [[g.label for g in r.gpus] for r in plan.ranks]


def plan(inv: Inventory, env: dict[str, str] | None = None, cpu_count: int = 4, **req: Any) -> Plan:
    return make_plan(parse_request(**req), inv, env or {}, cpu_count=cpu_count)


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


@given(st.permutations(list(range(8))), st.integers(1, 8), st.sampled_from(["rank", "node"]))
def test_named_gpus_keep_their_order_under_either_isolation(perm: list[int], n: int, isolation: str) -> None:
    named = perm[:n]
    p = plan(machine(8), gpus=",".join(map(str, named)), isolation=isolation)
    assert [r.gpus[0].index for r in p.ranks] == named
    assert [r.local_rank for r in p.ranks] == list(range(n)) and p.world_size == n
    if isolation == "rank":
        assert all(r.device == "cuda:0" and r.cuda_visible_devices == r.gpus[0].uuid for r in p.ranks)
    else:
        assert [r.device for r in p.ranks] == [f"cuda:{i}" for i in range(n)]
        assert {r.cuda_visible_devices for r in p.ranks} == {",".join(r.gpus[0].uuid for r in p.ranks)}


@given(st.integers(1, 8), st.integers(1, 4), st.data())
def test_global_ranks_are_contiguous_per_node(n: int, nnodes: int, data: Any) -> None:
    node_rank = data.draw(st.integers(0, nnodes - 1))
    p = plan(NONE, nproc=str(n), nnodes=nnodes, node_rank=node_rank)
    assert [r.rank for r in p.ranks] == list(range(node_rank * n, (node_rank + 1) * n))
    assert p.world_size == n * nnodes and p.local_world_size == n


# --- CPU ranks and their notes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inv", "env", "req", "count", "note"),
    [
        (NONE, {}, {}, 1, "1 CPU rank (gloo): this machine has no GPUs"),
        (NONE, {}, {"nproc": "auto"}, 4, "4 CPU ranks (gloo): this machine has no GPUs"),
        (machine(2), {}, {"cpu": True}, 1, "1 CPU rank (gloo): --cpu asked for CPU ranks"),
        (machine(2), {}, {"cpu": True, "nproc": "auto"}, 4, "--cpu asked for CPU ranks"),
        (machine(2), {}, {"cpu": True, "nproc": "cpu"}, 4, "--cpu asked for CPU ranks"),
        (machine(2), {}, {"nproc": "cpu"}, 4, "4 CPU ranks (gloo): --nproc cpu asked for one CPU rank per core"),
        (machine(2), {"CUDA_VISIBLE_DEVICES": "-1"}, {"nproc": "auto"}, 4, "CUDA_VISIBLE_DEVICES='-1' hides every"),
    ],
)
def test_cpu_ranks_say_why(inv: Inventory, env: dict[str, str], req: dict[str, Any], count: int, note: str) -> None:
    p = plan(inv, env, cpu_count=4, **req)
    assert p.backend == "gloo" and len(p.ranks) == count
    assert all(r.device == "cpu" and r.cuda_visible_devices == "" and r.gpus == () for r in p.ranks)
    assert any(note in n for n in p.notes), p.notes


def test_inventory_and_visibility_notes_come_first() -> None:
    p = plan(NONE, nproc="2")
    assert p.notes[0] == "no NVIDIA driver found" and p.notes[-1].startswith("2 CPU ranks")


# --- locks and busy GPUs ---------------------------------------------------------------------------


def test_busy_reasons_name_every_reason() -> None:
    gpu = machine(1, {0: {"memory_used": GIB, "utilization": 50, "processes": (1, 2)}}).gpus[0]
    req = parse_request(max_used_memory=512 * 2**20, max_util=10)
    assert busy_reasons(gpu, req, {gpu.uuid: "bob"}) == [
        "locked by bob",
        "1.0 GiB used > 512.0 MiB",
        "50% busy > 10%",
        "2 processes running",
    ]
    assert busy_reasons(machine(1).gpus[0], req) == []


def test_locked_gpus_are_skipped_even_by_nproc_gpu() -> None:
    inv = machine(4, {1: {"utilization": 90}})
    locked = {inv.gpus[0].uuid: "alice (pid 1)"}
    auto = make_plan(parse_request(nproc="2"), inv, {}, cpu_count=1, locked=locked)
    assert indices(auto) == [["2"], ["3"]]
    every = make_plan(parse_request(nproc="gpu"), inv, {}, cpu_count=1, locked=locked)
    assert indices(every) == [["1"], ["2"], ["3"]]  # busy 1 is used, locked 0 is not
    with pytest.raises(PlanError, match=r"locked by another ddpboot job: alice \(pid 1\)"):
        make_plan(parse_request(gpus="0"), inv, {}, cpu_count=1, locked=locked)
    shared = make_plan(parse_request(gpus="0", share=True), inv, {}, cpu_count=1, locked=locked)
    assert indices(shared) == [["0"]] and any("locked by alice" in n for n in shared.notes)


def test_shortage_explains_everything() -> None:
    inv = machine(4, {1: {"processes": (7,)}})
    with pytest.raises(PlanError) as err:
        plan(inv, {"CUDA_VISIBLE_DEVICES": "0,1,2"}, nproc="2", exclude="0")
    assert str(err.value) == (
        "2 ranks × 1 GPU need 2 free GPUs, but only 1 is free (2); this machine has 4 GPUs: 0, 1, 2, 3; "
        "busy: 1 (1 process running); excluded: 0; CUDA_VISIBLE_DEVICES='0,1,2' allows 0, 1, 2. Ask for fewer "
        "ranks, name GPUs with --gpus (busy ones included), or raise --max-used-memory / --max-util."
    )


def test_leftover_gpus_are_noted() -> None:
    p = plan(machine(5), nproc="gpu", gpus_per_proc=2)
    assert indices(p) == [["0", "1"], ["2", "3"]]
    assert "1 GPU(s) left unused: 5 GPUs do not split into groups of 2" in p.notes


# --- more refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inv", "env", "req", "kind", "match"),
    [
        (NONE, {}, {"gpus_per_proc": 2}, PlanError, "--gpus-per-proc 2 asks for GPUs, but this machine has none"),
        (machine(2), {}, {"cpu": True, "gpus_per_proc": 2}, UsageError, "needs GPUs, but --cpu asked"),
        (machine(2), {}, {"nproc": "auto", "exclude": "0-1"}, PlanError, "--exclude 0-1 leaves no GPU to run on"),
        (machine(2), {}, {"nproc": "auto", "gpus_per_proc": 3}, PlanError, "1 rank × 3 GPUs need 3 free GPUs"),
        (machine(4), {"CUDA_VISIBLE_DEVICES": "0,1"}, {"exclude": "0,1"}, PlanError, "and CUDA_VISIBLE_DEVICES="),
        (machine(2, {0: {"utilization": 50}, 1: {"utilization": 50}}), {}, {"nproc": "auto"}, PlanError, "busy: 0"),
        (machine(2), {"CUDA_VISIBLE_DEVICES": ""}, {"gpus_per_proc": 2}, PlanError, "hides every GPU"),
        (machine(4), {}, {"gpus": "0", "exclude": "0"}, UsageError, "GPU 0 is both listed in --gpus 0"),
    ],
)
def test_more_bad_requests(
    inv: Inventory, env: dict[str, str], req: dict[str, Any], kind: type[DdpbootError], match: str
) -> None:
    with pytest.raises(kind, match=match):
        plan(inv, env, **req)


def test_plan_json() -> None:
    p = plan(machine(2), nproc="2", cpu_affinity="0-3")
    data = p.to_json()
    assert (data["world_size"], data["local_world_size"], data["isolation"], data["backend"]) == (2, 2, "rank", "nccl")
    assert (data["inventory"], data["visible"]) == ("fake", "all GPUs")
    assert [(r["rank"], r["device"], r["cpus"], r["omp_threads"]) for r in data["ranks"]] == [
        (0, "cuda:0", [0, 1], 2),
        (1, "cuda:0", [2, 3], 2),
    ]
    assert data["ranks"][1]["gpus"][0]["index"] == 1


# --- first contact: what an impossible request and a stray CUDA_VISIBLE_DEVICES are told -------------------


def test_more_ranks_than_gpus_says_how_many_fit_not_to_raise_thresholds() -> None:
    with pytest.raises(PlanError) as refused:
        plan(machine(8), nproc="9")
    text = str(refused.value)
    assert not isinstance(refused.value, GpusBusy)
    assert "Ask for at most 8 ranks" in text and "--max-used-memory" not in text


def test_busy_gpus_are_worth_waiting_for() -> None:
    with pytest.raises(GpusBusy, match="raise --max-used-memory"):
        plan(machine(2, {0: {"memory_used": 40 * GIB}}), nproc="2")


@pytest.mark.parametrize("visible", ["9", "GPU-nonexistent", "9,0"])
def test_a_cuda_visible_devices_naming_no_gpu_is_an_error(visible: str) -> None:
    with pytest.raises(PlanError, match=r"names no GPU of this machine .*'' or -1 for CPU ranks on purpose"):
        plan(machine(8), {"CUDA_VISIBLE_DEVICES": visible}, nproc="2")


@pytest.mark.parametrize("visible", ["", "-1"])
def test_only_empty_and_minus_one_mean_cpu_ranks(visible: str) -> None:
    got = plan(machine(8), {"CUDA_VISIBLE_DEVICES": visible}, nproc="2")
    assert got.backend == "gloo" and all(not r.gpus for r in got.ranks)


def test_a_gpu_marked_failing_is_never_chosen_automatically_and_named_runs_with_a_note() -> None:
    inv = machine(3)
    bad = {inv.gpus[1].uuid: "Xid 79 (the GPU has fallen off the bus), seen by job j"}
    assert indices(make_plan(parse_request(nproc="2"), inv, {}, cpu_count=2, failing=bad)) == [["0"], ["2"]]
    assert indices(make_plan(parse_request(nproc="gpu"), inv, {}, cpu_count=2, failing=bad)) == [["0"], ["2"]]
    assert indices(make_plan(parse_request(nproc="auto"), inv, {}, cpu_count=2, failing=bad)) == [["0"], ["2"]]
    named = make_plan(parse_request(gpus="1"), inv, {}, cpu_count=2, failing=bad)
    assert indices(named) == [["1"]]
    assert [n for n in named.notes if FAILING_NOTE in n] == [
        "GPU 1 is marked failing (Xid 79 (the GPU has fallen off the bus), seen by job j) but was asked for with "
        "--gpus: running on it anyway (`ddpboot gpus --clear 1` clears the mark)"]
    assert busy_reasons(inv.gpus[1], parse_request(), failing=bad) == [f"failing: {bad[inv.gpus[1].uuid]}"]


def test_too_few_healthy_gpus_is_no_wait_for_a_failing_one() -> None:
    inv = machine(3)
    bad = {inv.gpus[1].uuid: "Xid 79"}
    with pytest.raises(PlanError, match=r"busy: 1 \(failing: Xid 79\)") as err:
        make_plan(parse_request(nproc="3"), inv, {}, cpu_count=3, failing=bad)
    assert not isinstance(err.value, GpusBusy)  # --wait-for-gpus would wait for ever
    locked = {inv.gpus[0].uuid: "alice"}
    with pytest.raises(GpusBusy):  # a locked GPU is worth waiting for
        make_plan(parse_request(nproc="2"), inv, {}, cpu_count=3, failing=bad, locked=locked)
