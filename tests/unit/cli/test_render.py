"""What the tools print (ddpboot/cli/render.py)."""

from __future__ import annotations

import pytest

from ddpboot.cli.render import plan_head, plan_notes, render_dry_run, render_gpus, render_plan
from ddpboot.cli.tools import gpu_states
from ddpboot.launch.preview import DryRun, dry_run_workers
from ddpboot.launch.spec import Target
from ddpboot.selection.gpu import Inventory
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import Plan, make_plan
from ddpboot.selection.request import parse_request
from ddpboot.units import short_uuid
from tests.support import launch_spec


def plan(**req: object) -> Plan:
    return make_plan(parse_request(**req), fake_inventory("4"), {}, cpu_count=8)  # type: ignore[arg-type]


def test_uuids_are_cut_to_a_column() -> None:
    assert short_uuid("GPU-0123456789abcdef") == "GPU-01234567…"
    assert short_uuid("GPU-01234567") == "GPU-01234567"


def test_the_plan_table_says_what_cuda_0_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    render_plan(plan(gpus="3,1"))
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "world size 2 · 1 node · isolation rank · backend nccl"
    rows = [line for line in out.splitlines() if "cuda:0 = GPU" in line]
    assert "cuda:0 = GPU 3" in rows[0] and "cuda:0 = GPU 1" in rows[1]


def test_a_dry_run_shows_each_command_and_what_it_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    spec = launch_spec(target=Target("script", "train.py", ("--lr", "0.1")), python="/usr/bin/python3")
    planned = plan(nproc="2")
    render_dry_run(DryRun(planned, spec, dry_run_workers(planned, spec, {"RANK": "9"}), ()), {"RANK": "9"})
    out = capsys.readouterr().out
    assert "store: python server on 127.0.0.1:<a free port bound at launch>" in out
    assert "rank 1 (local rank 1): /usr/bin/python3 -u train.py --lr 0.1" in out
    assert "  RANK=1  (was '9')" in out and "  MASTER_PORT='<port bound at launch>'" in out


def _rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if "│" in line]


@pytest.mark.parametrize("columns", [60, 80, 120, 200])
def test_the_plan_keeps_its_map_at_every_width(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    render_plan(make_plan(parse_request(nproc="2", exclude="0"), fake_inventory("8"), {}, cpu_count=8))
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "┃" in line)
    assert [h.strip() for h in header.split("┃")][:3] == ["rank", "local", "GPU"] and "device" in header
    rows = _rows(out)
    assert len(rows) == 2  # one line per rank: nothing wraps
    for rank, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│")]
        assert cells[:3] == [str(rank), str(rank), str(rank + 1)]
        assert f"cuda:0 = GPU {rank + 1}" in cells
    assert all(len(line) <= columns for line in [header, *rows])


def test_wide_adds_full_uuids_and_bus_ids(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    inventory = fake_inventory("8")
    render_plan(make_plan(parse_request(nproc="1"), inventory, {}, cpu_count=8))
    narrow = capsys.readouterr().out
    render_plan(make_plan(parse_request(nproc="1"), inventory, {}, cpu_count=8), wide=True)
    wide = capsys.readouterr().out
    gpu = inventory.gpus[0]
    assert gpu.uuid not in narrow and gpu.pci_bus_id not in narrow
    assert gpu.uuid in wide and gpu.pci_bus_id in wide


@pytest.mark.parametrize("columns", [60, 80, 120, 200])
def test_the_gpu_table_keeps_index_and_state_at_every_width(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    inventory = fake_inventory("8")
    render_gpus(gpu_states(inventory, parse_request(exclude="3"), {}), inventory)
    rows = _rows(capsys.readouterr().out)
    assert len(rows) == 8
    for index, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│")]
        assert cells[0] == str(index) and cells[-1] == ("excluded" if index == 3 else "free")
        assert len(row) <= columns


def test_a_locked_gpu_names_its_holder_without_a_command_line() -> None:
    from ddpboot.cli.render import gpu_state

    holder = {"user": "alice", "pid": 42, "since": 0.0, "host": "box"}
    assert gpu_state({"locked": True, "locked_by": holder}) == "[magenta]locked[/] by alice (pid 42, since ?)"


def test_the_head_breaks_between_parts_never_inside_one() -> None:
    restricted = make_plan(parse_request(gpus="3"), fake_inventory("8"), {"CUDA_VISIBLE_DEVICES": "2,3"}, cpu_count=8)
    wide = plan_head(restricted, 200)
    assert wide == ["[bold]world size 1[/] · 1 node · isolation [bold]rank[/] · backend nccl · "
                    "CUDA_VISIBLE_DEVICES='2,3' allows 2, 3"]
    narrow = plan_head(restricted, 60)
    assert narrow == ["[bold]world size 1[/] · 1 node · isolation [bold]rank[/] · backend nccl",
                      "CUDA_VISIBLE_DEVICES='2,3' allows 2, 3"]


NO_DRIVER = Inventory((), "none", ("no NVIDIA driver found (NVML: Driver Not Loaded); planning for CPU ranks",))


def test_without_a_driver_the_plan_says_so_once_and_sends_to_gpus() -> None:
    """The inventory's reason is the plan's first note (make_plan puts it there); `ddpboot gpus` prints it, the plan
    says that no GPU was found and where to read why."""
    cpu = make_plan(parse_request(nproc="2"), NO_DRIVER, {}, cpu_count=2)
    assert cpu.notes[0] == NO_DRIVER.notes[0]
    assert plan_notes(cpu) == ["2 CPU ranks (gloo): this machine has no GPUs"]
    assert "no GPUs found (`ddpboot gpus` says why)" in " ".join(plan_head(cpu, 200))
    assert not any("inventory" in line or "visible" in line for line in plan_head(cpu, 200))
    simulated = make_plan(parse_request(nproc="2"), fake_inventory("0"), {}, cpu_count=2)
    assert plan_notes(simulated)[0].startswith("simulated inventory: 0 idle GPUs")


@pytest.mark.parametrize("columns", [60, 80])
def test_wide_that_does_not_fit_is_one_block_per_rank(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    inventory = fake_inventory("8")
    render_plan(make_plan(parse_request(nproc="2", exclude="0"), inventory, {}, cpu_count=8), wide=True)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= columns for line in lines)
    titles = [line for line in lines if line.startswith("rank ")]
    assert titles == [f"rank {r} · local {r} · GPU {r + 1} · device cuda:0 = GPU {r + 1}" for r in (0, 1)]
    text = "".join(line.strip() for line in lines)  # a UUID folded at 60 columns still reads whole
    for gpu in inventory.gpus[1:3]:
        assert gpu.uuid in text and gpu.pci_bus_id in text
    assert {line.split()[0] for line in lines if line.startswith("  ") and line.split()} >= {
        "UUID", "PCI", "name", "free", "CUDA_VISIBLE_DEVICES", "cores"}


@pytest.mark.parametrize("columns", [80, 200])
def test_gpus_wide_shows_everything_gpus_shows(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    inventory = fake_inventory("2")
    records = gpu_states(inventory, parse_request(), {})
    render_gpus(records, inventory)
    narrow = capsys.readouterr().out
    render_gpus(records, inventory, wide=True)
    wide = capsys.readouterr().out
    assert all(len(line) <= columns for line in wide.splitlines())
    for gpu in inventory.gpus:
        assert gpu.uuid in wide and gpu.pci_bus_id in wide and gpu.uuid not in narrow
    header = next(line for line in narrow.splitlines() if "┃" in line)
    for name in [h.strip() for h in header.split("┃")]:
        assert name in wide
