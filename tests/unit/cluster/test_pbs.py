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
    assert layout(env)[:7] == (4, 6, 1, 3, 1, 2, "n07")
    assert PbsEnvironment({**task(nodefile, 0, 2, 0), "MASTER_PORT": "3000"}).main_port == 3000


def test_each_pbsdsh_step_derives_its_own_port(nodefile: Path) -> None:
    """Two pbsdsh steps of one job at once: the port comes from PBS_JOBID and the step's command (this process's
    command line by default), the same for every task of a step."""
    ports = {step: PbsEnvironment(task(nodefile, 1, 3, 0), step=step).main_port
             for step in ("python train.py", "python eval.py")}
    assert ports["python train.py"] == job_port("PBS_JOBID=123.server python train.py")
    assert len(set(ports.values())) == 2
    assert PbsEnvironment(task(nodefile, 5, 7, 1), step="python train.py").main_port == ports["python train.py"]
    assert PbsEnvironment(task(nodefile, 1, 3, 0)).main_port == PbsEnvironment(task(nodefile, 4, 6, 1)).main_port


def sister(vnode: int, tasknum: int, nodenum: int) -> dict[str, str]:
    """What Torque's pbs_mom gives a task on a host other than the first (src/resmom/start_exec.c, mom_comm.c):
    the job's variables, PBS_NODENUM, PBS_TASKNUM, PBS_VNODENUM, PBS_NUM_NODES / PBS_NUM_PPN, but no PBS_NODEFILE,
    which it writes on the first host only."""
    return {"PBS_JOBID": "123.server", "PBS_ENVIRONMENT": "PBS_BATCH", "PBS_JOBNAME": "job", "PBS_QUEUE": "batch",
            "PBS_JOBCOOKIE": "0A1B", "PBS_MOMPORT": "15003", "PBS_NUM_NODES": "2", "PBS_NUM_PPN": "3",
            "PBS_O_WORKDIR": "/home/u", "PBS_VNODENUM": str(vnode), "PBS_TASKNUM": str(tasknum),
            "PBS_NODENUM": str(nodenum)}


def test_a_sister_host_says_exactly_what_to_pass() -> None:
    # a rank of `pbsdsh python train.py` on the second host: detected, and told what to pass
    with pytest.raises(WorkerEnvError, match=r"^this pbsdsh task \(PBS_VNODENUM=4\) has no PBS_NODEFILE\. Torque "
                       r"writes PBS_NODEFILE on the job's first host only.*PBS_NODEFILE=\$PBS_O_WORKDIR/nodes"):
        detect_environment(sister(4, 6, 1))
    # a launcher of `pbsdsh -u ddpboot ...` on the second host: node 0's host and the node count must be given
    for given, missing in (({}, "--master-addr \\(or MASTER_ADDR\\) and --nnodes are"),
                           ({"MASTER_ADDR": "n07"}, "--nnodes is")):
        with pytest.raises(WorkerEnvError, match=rf"^this pbsdsh task \(PBS_NODENUM=1\) has no PBS_NODEFILE, and "
                           rf"{missing} not given\..*MASTER_ADDR=\$\(head -1 \$PBS_NODEFILE\) ddpboot --nnodes"):
            pbs_node_info({**sister(3, 3, 1), **given})
    info = pbs_node_info({**sister(3, 3, 1), "MASTER_ADDR": "n07"}, nnodes=2, step="s")
    assert tuple(info) == (2, 1, "n07", job_port("PBS_JOBID=123.server s"))
    with pytest.raises(WorkerEnvError, match="PBS_NODENUM=2 is not below --nnodes=2"):
        pbs_node_info({**sister(3, 3, 2), "MASTER_ADDR": "n07"}, nnodes=2)


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
    assert pbs_node_info(task(nodefile, 3, 3, 1), step="x").master_port == job_port("PBS_JOBID=123.server x")
    with pytest.raises(WorkerEnvError, match="PBS_NODENUM=2 is not below the hosts of PBS_NODEFILE=2"):
        pbs_node_info(task(nodefile, 3, 3, 2))
