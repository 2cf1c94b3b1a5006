"""PbsEnvironment and the node file, from the variables pbs_mom gives a task and the PBS_NODEFILE it writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpboot.cluster import PbsEnvironment, detect_environment
from ddpboot.cluster.base import job_port
from ddpboot.cluster.pbs import pbs_node_info
from ddpboot.errors import WorkerEnvError

Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]


@pytest.fixture
def nodefile(tmp_path: Path) -> Path:
    """`qsub -l nodes=2:ppn=3`: each host once per slot, its lines together."""
    path = tmp_path / "aggregate" / "123.server"
    path.parent.mkdir()
    path.write_text("n07\nn07\nn07\nn12\nn12\nn12\n")
    return path


def task(nodefile: Path, vnode: int, tasknum: int, nodenum: int) -> dict[str, str]:
    return {"PBS_JOBID": "123.server", "PBS_NODEFILE": str(nodefile), "PBS_ENVIRONMENT": "PBS_BATCH",
            "PBS_VNODENUM": str(vnode), "PBS_TASKNUM": str(tasknum), "PBS_NODENUM": str(nodenum)}


def test_a_pbsdsh_task_is_the_rank_of_its_node_file_line(nodefile: Path, layout: Layout) -> None:
    env = detect_environment(task(nodefile, 4, 6, 1))
    assert isinstance(env, PbsEnvironment) and env.name == "pbs"
    assert layout(env) == (4, 6, 1, 3, 1, 2, "n07", job_port("PBS_JOBID=123.server"))
    assert PbsEnvironment({**task(nodefile, 0, 2, 0), "MASTER_PORT": "3000"}).main_port == 3000


def test_the_batch_script_is_not_rank_0(nodefile: Path) -> None:
    # pbs_mom gives the job script the same variables, as task 1 on vnode 0
    assert detect_environment(task(nodefile, 0, 1, 0)) is None


def test_node_file_errors(nodefile: Path, tmp_path: Path) -> None:
    with pytest.raises(WorkerEnvError, match="PBS_VNODENUM=6 is not below the lines of PBS_NODEFILE=6"):
        PbsEnvironment(task(nodefile, 6, 8, 1))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(WorkerEnvError, match="is empty"):
        PbsEnvironment(task(empty, 0, 2, 0))
    with pytest.raises(WorkerEnvError, match="cannot be read"):
        PbsEnvironment(task(tmp_path / "missing", 0, 2, 0))


def test_one_launcher_per_host(nodefile: Path) -> None:
    # `pbsdsh -u ddpboot ...` on the second host
    assert tuple(pbs_node_info(task(nodefile, 3, 3, 1))) == (2, 1, "n07", job_port("PBS_JOBID=123.server"))
    with pytest.raises(WorkerEnvError, match="PBS_NODENUM=2 is not below the hosts of PBS_NODEFILE=2"):
        pbs_node_info(task(nodefile, 3, 3, 2))
