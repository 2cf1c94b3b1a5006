"""A job shown without starting it (ddpboot/launch/preview.py): each worker as the first attempt would get it, and
the dry run's JSON, built from the same workers."""

from __future__ import annotations

from pathlib import Path

from ddpboot.launch.preview import PORT_AT_LAUNCH, DryRun, dry_run_workers, plan_json
from ddpboot.launch.spec import Target
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import make_plan
from ddpboot.selection.request import parse_request
from tests.support import launch_spec


def test_each_worker_gets_its_command_and_variables_with_placeholders_for_what_only_the_launch_knows() -> None:
    plan = make_plan(parse_request(nproc="2"), fake_inventory("4"), {}, cpu_count=8)
    spec = launch_spec(target=Target("script", "train.py", ("--rank", "${local_rank}")), python="/usr/bin/python3")
    workers = dry_run_workers(plan, spec, {})
    assert [(w.rank, w.local_rank, w.argv) for w in workers] == [
        (0, 0, ["/usr/bin/python3", "-u", "train.py", "--rank", "0"]),
        (1, 1, ["/usr/bin/python3", "-u", "train.py", "--rank", "1"])]
    assert workers[1].variables["MASTER_PORT"] == PORT_AT_LAUNCH and workers[1].variables["RANK"] == "1"
    error_file = Path(workers[0].variables["TORCHELASTIC_ERROR_FILE"])
    assert error_file.parts[0] == "<log dir>" and error_file.name == "rank0.error.json"
    fixed = dry_run_workers(plan, launch_spec(master_port=29999), {})
    assert fixed[0].variables["MASTER_PORT"] == "29999"


def test_the_json_is_built_from_the_same_workers() -> None:
    plan = make_plan(parse_request(nproc="2"), fake_inventory("4"), {}, cpu_count=8)
    spec = launch_spec(run_id="job-3")
    workers = dry_run_workers(plan, spec, {})
    data = DryRun(plan, spec, workers, ("a note",)).to_json()
    assert data["plan"] == plan_json(plan) and data["run_id"] == "job-3" and data["notes"] == ["a note"]
    assert data["store"] == {"backend": "python", "bind_addr": "127.0.0.1", "master_addr": "127.0.0.1", "port": None}
    assert data["workers"] == [{"rank": w.rank, "local_rank": w.local_rank, "argv": w.argv, "cpus": list(w.cpus),
                                "env": w.variables} for w in workers]
