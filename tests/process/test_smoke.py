"""`ddpboot smoke` on CPU ranks: its JSON and JUnit reports, and injected faults caught and attributed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import xmlschema

from tests.support import REPO, clean_env, run_ddpboot, tagged

SCHEMA = xmlschema.XMLSchema(REPO / "tests" / "data" / "junit.xsd")


def smoke(*args: str, fault: str | None = None, **env: str) -> tuple[int, Any, str]:
    e = clean_env(**env)
    if fault:
        e["DDPBOOT_SMOKE_FAULT"] = fault
    out = run_ddpboot("smoke", "--json", *args, env=e, timeout=180)
    return out.returncode, json.loads(out.stdout) if out.stdout.strip().startswith("{") else None, out.stderr


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.NoSuchProcess:  # gone since it was listed
        return []


def verdicts(report: Any, check: str) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["check"] == check]


def test_two_ranks_pass_with_json_and_junit(tmp_path: Path) -> None:
    junit = tmp_path / "smoke.xml"
    code, report, err = smoke("--nproc", "2", "--junit-xml", str(junit), "--max-bytes", "4MiB")
    assert code == 0, (err, [c for c in report["checks"] if c["status"] == "fail"] if report else None)
    assert report["passed"] and report["world_size"] == 2 and report["backend"] == "gloo"
    checks = {c["check"] for c in report["checks"]}
    assert checks >= {"init", "mapping", "all_reduce", "broadcast", "all_gather", "barrier", "ddp", "bandwidth"}
    bandwidth = verdicts(report, "bandwidth")
    assert all(v["figures"]["device"] == "CPU" and v["figures"]["sizes"] for v in bandwidth)
    assert verdicts(report, "reduce_scatter")[0]["status"] == "skip"  # gloo has none
    SCHEMA.validate(str(junit))
    assert junit.read_text().count("<testcase") == len(report["checks"])


def test_corrupted_input_fails_all_reduce_and_names_the_rank() -> None:
    code, report, err = smoke("--nproc", "2", "--checks", "all_reduce,barrier", fault="corrupt:1")
    assert code == 1, err
    failed = [v for v in report["checks"] if v["status"] == "fail"]
    assert {v["check"] for v in failed} == {"all_reduce"}
    assert all("wrong input from rank(s) 1" in v["detail"] for v in failed)


def test_a_hanging_rank_fails_its_check_within_the_timeout(tmp_path: Path) -> None:
    junit = tmp_path / "smoke.xml"
    tag = uuid.uuid4().hex  # this run's processes (other smoke runs on the machine are not this test's)
    code, report, err = smoke(
        "--nproc",
        "2",
        "--timeout",
        "12",  # the run's deadline (the ranks' collectives time out after 12 - 5 s): all_reduce passes within it
        "--checks",
        "all_reduce,broadcast",
        "--junit-xml",
        str(junit),
        fault="hang:1:broadcast",
        SMOKE_TEST_RUN=tag,
    )
    assert code == 1, err
    (mine,) = [v for v in verdicts(report, "broadcast") if v["rank"] == 1]
    assert mine["status"] == "fail" and "rank 1 never reached broadcast" in mine["detail"]
    assert all(v["status"] == "pass" for v in verdicts(report, "all_reduce"))
    SCHEMA.validate(str(junit))
    assert "<failure" in junit.read_text()
    left = [p.pid for p in tagged(tag, "SMOKE_TEST_RUN") if "ddpboot.smoke.rank" in " ".join(cmdline(p))]
    assert not left, f"ranks still running after the smoke run ended: {left}"


def test_the_timeout_dumps_where_every_rank_was() -> None:
    """Every rank stuck (none of their own collective timeouts fires): only the driver's --timeout ends the run, and
    the launcher's stack dump before the stop names each rank's place in the notes."""
    code, report, err = smoke("--nproc", "2", "--timeout", "12", "--checks", "broadcast", fault="hang:all:broadcast")
    assert code == 1, err
    notes = [n for n in report["notes"] if n.startswith("at the timeout, rank")]
    assert [n.split(" (")[0] for n in notes] == ["at the timeout, rank 0", "at the timeout, rank 1"], report["notes"]
    assert all("(CPU" in n and "rank.py" in n for n in notes), notes


def test_simulated_gpus_and_max_bytes_capped(fake_gpus: Any) -> None:
    path = fake_gpus([{"memory_total": 64 * 2**20}, {"memory_total": 64 * 2**20}])
    code, report, err = smoke(
        "--nproc", "2", "--checks", "mapping,bandwidth", "--max-bytes", "1GiB", DDPBOOT_FAKE_GPUS=path
    )
    assert code == 0, err
    assert any("capped at 16.0 MiB" in n for n in report["notes"])
    assert all(v["status"] == "skip" and "simulated" in v["detail"] for v in verdicts(report, "mapping"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "3"], "need 3 free GPUs"),
        (["--checks", "all_reduce,nonsense"], "no check named 'nonsense'. The checks are: mapping"),
        (["--timeout", "0"], "--timeout 0"),
    ],
)
def test_bad_input(args: list[str], message: str) -> None:
    out = run_ddpboot("smoke", *args, env=clean_env(DDPBOOT_FAKE_GPUS="2"))
    assert out.returncode == 2 and message in " ".join(out.stderr.split()), out.stderr
    assert "Traceback" not in out.stderr


def test_the_report_names_the_backend_the_ranks_ran(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddpboot.cli.render import render_smoke
    from ddpboot.selection.inventory import fake_inventory
    from ddpboot.selection.planner import make_plan
    from ddpboot.selection.request import parse_request
    from ddpboot.smoke import Report, Verdict

    plan = make_plan(parse_request(nproc="2"), fake_inventory("2"), {}, cpu_count=2)
    assert plan.backend == "nccl"  # simulated GPUs are planned as GPUs; their ranks run gloo on CPU
    inits = [Verdict("init", r, "pass", "gloo on cpu", {"backend": "gloo"}) for r in (0, 1)]
    report = Report(plan, inits, 0, 1.0, [])
    assert report.backend == "gloo" and report.to_json()["backend"] == "gloo"
    monkeypatch.setenv("COLUMNS", "120")
    render_smoke(report)
    assert "smoke PASSED: 2 ranks, gloo," in capsys.readouterr().out
    assert Report(plan, [], None, 1.0, []).backend == "nccl"  # no rank got as far as init: the plan's
