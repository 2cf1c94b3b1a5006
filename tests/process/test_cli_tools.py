"""The real `ddpboot` console script: `plan` and `gpus`, their JSON, their errors, and what they import."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support import GIB, clean_env, ddpboot_exe, run_ddpboot


def fake_env(spec: str, **extra: str) -> dict[str, str]:
    return clean_env(DDPBOOT_FAKE_GPUS=spec, **extra)


def test_plan_json_follows_the_contract() -> None:
    out = run_ddpboot("plan", "--nproc", "4", "--exclude", "0", "--json", env=fake_env("8"))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert (plan["world_size"], plan["nnodes"], plan["node_rank"], plan["isolation"]) == (4, 1, 0, "rank")
    assert [r["rank"] for r in plan["ranks"]] == [0, 1, 2, 3]
    assert [r["gpus"][0]["index"] for r in plan["ranks"]] == [1, 2, 3, 4]
    for r in plan["ranks"]:
        (gpu,) = r["gpus"]
        assert set(gpu) >= {"index", "uuid", "pci_bus_id", "name", "memory_total", "memory_used"}
        assert r["cuda_visible_devices"] == gpu["uuid"] and gpu["uuid"].startswith("GPU-")


def test_plan_table_shows_the_map() -> None:
    out = run_ddpboot("plan", "--gpus", "7,5", env=fake_env("8"))
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "cuda:0 = GPU" in line]
    assert len(rows) == 2 and "cuda:0 = GPU 7" in rows[0] and "cuda:0 = GPU 5" in rows[1]


def test_gpus_json_shows_busy_excluded_and_not_visible(fake_gpus: Any) -> None:
    path = fake_gpus([{"memory_used": 30 * GIB, "utilization": 99}, {}, {}, {}])
    out = run_ddpboot("gpus", "--json", "--exclude", "2", env=fake_env(path, CUDA_VISIBLE_DEVICES="0,1,2"))
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    keys = {
        "index",
        "uuid",
        "pci_bus_id",
        "name",
        "memory_total",
        "memory_used",
        "utilization",
        "visible",
        "busy",
        "locked",
    }
    assert all(keys <= set(g) for g in gpus)
    assert [(g["busy"], g["excluded"], g["visible"]) for g in gpus] == [
        (True, False, True),
        (False, False, True),
        (False, True, True),
        (False, False, False),
    ]


def test_gpus_table_without_gpus_says_why() -> None:
    out = run_ddpboot("gpus", env=fake_env("0"))
    assert out.returncode == 0 and "No GPUs" in out.stdout


@pytest.mark.parametrize(
    ("args", "env_extra", "message"),
    [
        (["--gpus", "9"], {}, "GPU 9 does not exist"),
        (["--nproc", "9"], {}, "need 9 free GPUs"),
        (["--gpus", "1", "--exclude", "1"], {}, "both listed"),
        (["--gpus", "1,,2"], {}, "is empty"),
        (["--nproc", "0"], {}, "at least 1"),
        (["--gpus", "0"], {"CUDA_VISIBLE_DEVICES": "2,3"}, "not visible"),
        (["--nproc", "gpu"], {"CUDA_VISIBLE_DEVICES": "-1"}, "hides every GPU"),
        (["--nproc", "1"], {"CUDA_VISIBLE_DEVICES": "1,1"}, "twice"),
        (["--nproc", "1"], {"DDPBOOT_FAKE_GPUS": "lots"}, "neither a GPU count"),
        (["--max-used-memory", "huge"], {}, "not a size"),
        (["--nnodes", "1:2"], {}, "elastic"),
    ],
)
def test_plan_errors_exit_2_with_one_message(args: list[str], env_extra: dict[str, str], message: str) -> None:
    env = fake_env("8")
    env.update(env_extra)
    out = run_ddpboot("plan", *args, env=env)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_pet_environment_defaults() -> None:
    out = run_ddpboot("plan", "--json", env=fake_env("8", PET_NPROC_PER_NODE="3"))
    assert json.loads(out.stdout)["world_size"] == 3


def test_help_explains_the_index_rules() -> None:
    out = run_ddpboot("plan", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "physical indices" in text and "CUDA_VISIBLE_DEVICES=2,3" in text


def test_python_dash_m_is_the_same_program() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ddpboot", "plan", "--json", "--nproc", "2"],
        env=fake_env("4"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and json.loads(out.stdout)["world_size"] == 2


@pytest.mark.parametrize("tool", [["plan", "--nproc", "2"], ["gpus"]])
def test_tools_import_neither_torch_nor_cuda(tool: list[str]) -> None:
    """`python -X importtime` lists every module imported; torch must not be among them."""
    cmd = [
        sys.executable,
        "-X",
        "importtime",
        "-c",
        "import sys; from ddpboot.cli import main; main(sys.argv[1:])",
        *tool,
    ]
    out = subprocess.run(cmd, env=fake_env("8"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time")}
    assert "ddpboot.cli" in imported  # the probe sees our imports
    assert not {m for m in imported if m == "torch" or m.startswith(("torch.", "cuda"))}


def test_console_script_is_installed() -> None:
    assert ddpboot_exe()[0].endswith("ddpboot")
