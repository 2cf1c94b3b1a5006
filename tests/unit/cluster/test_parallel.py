"""Signs of a parallel launch no known environment describes (cluster/parallel.py), and init()'s refusal."""

from __future__ import annotations

import pytest

from ddpboot.cluster import LocalEnvironment, detect_environment
from ddpboot.cluster.parallel import parallel_signs, unknown_launch
from ddpboot.errors import WorkerEnvError

UNKNOWN = [
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, ["PMI_SIZE=2", "PMI_RANK=1"], "PMI launcher"),  # Flux-like
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, ["PMI_SIZE=2"], "PMI launcher"),  # its first task too: the size says it
    ({"PMIX_RANK": "3", "PMIX_NAMESPACE": "prterun-h-1@1"}, ["PMIX_RANK=3"], "PMIx launcher"),
    ({"PBS_JOBID": "7.pbs", "PBS_TASKNUM": "0000000B", "PBS_NODENUM": "1", "PBS_MOMPORT": "15003"},
     ["PBS_TASKNUM=0000000B"], "OpenPBS"),  # OpenPBS's tm_spawn writes the task id as %8.8X
    ({"LSB_JOBID": "42", "LSF_PM_TASKID": "2"}, ["LSF_PM_TASKID=2"], "blaunch"),
    ({"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2"}, ["FLUX_TASK_RANK=1", "FLUX_JOB_SIZE=2"], "Flux"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, ["OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1"],
     "incomplete"),
]


@pytest.mark.parametrize(("env", "signs", "who"), UNKNOWN)
def test_a_task_of_an_unknown_launcher_is_not_a_world_of_one(env: dict[str, str], signs: list[str], who: str) -> None:
    assert detect_environment(env, plugins=()) is None
    assert parallel_signs(env) == signs
    with pytest.raises(WorkerEnvError, match=rf"^{', '.join(signs)} say this process is one of several tasks \(.*"
                       rf"{who}.*world of one.*unset them\.$"):
        LocalEnvironment(env)


@pytest.mark.parametrize("env", [
    {}, {"PMI_RANK": "0", "PMI_SIZE": "1"}, {"PMIX_RANK": "0", "PMIX_NAMESPACE": "x"},
    {"PBS_JOBID": "7.pbs", "PBS_TASKNUM": "1", "PBS_NODENUM": "0"},  # the batch script itself
    {"LSB_JOBID": "42", "LSF_PM_TASKID": "1"}, {"PBS_JOBID": "7.pbs", "PBS_TASKNUM": "zz"},
])
def test_a_first_or_only_task_runs_alone(env: dict[str, str]) -> None:
    assert unknown_launch(env, "x") is None
    assert LocalEnvironment(env).world_size == 1
