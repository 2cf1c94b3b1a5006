"""JsrunEnvironment and LSF's host lists, from the variables and files LSF and jsrun write (no LSF here)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpboot.cluster import JsrunEnvironment, detect_environment
from ddpboot.cluster.base import job_port
from ddpboot.cluster.lsf import lsf_hosts
from ddpboot.errors import WorkerEnvError

Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]
# task 7 of `jsrun -n 4 -a 2 -g 2` on a CSM cluster: 4 resource sets of 2 tasks, 2 per host
JSRUN = {"JSM_NAMESPACE_RANK": "7", "JSM_NAMESPACE_SIZE": "8", "JSM_NAMESPACE_LOCAL_RANK": "1",
         "JSM_NAMESPACE_LOCAL_SIZE": "2", "LSB_JOBID": "12345", "PMIX_NAMESPACE": "12345.3",
         "LSB_MCPU_HOSTS": "batch1 1 a01n01 42 a01n02 42"}


def test_jsrun_ranks(layout: Layout) -> None:
    env = detect_environment({**JSRUN, "MASTER_ADDR": "a01n01"})
    assert isinstance(env, JsrunEnvironment) and env.name == "lsf"
    assert layout(env) == (7, 8, 1, 2, 3, 4, "a01n01", job_port("PMIX_NAMESPACE=12345.3"))
    without_step = {k: v for k, v in JSRUN.items() if k != "PMIX_NAMESPACE"}
    assert JsrunEnvironment({**without_step, "MASTER_ADDR": "h"}).main_port == job_port("LSB_JOBID=12345")
    assert env.placed_by_hosts  # jsrun's placement may be cyclic: init() asks where the ranks run


def test_several_hosts_without_master_addr_say_what_to_set() -> None:
    with pytest.raises(WorkerEnvError, match=r"MASTER_ADDR is not set.*as batch1, a01n01, a01n02\..*LSB_MCPU_HOSTS"):
        JsrunEnvironment(JSRUN)
    one_host = {**JSRUN, "JSM_NAMESPACE_SIZE": "2", "JSM_NAMESPACE_RANK": "1"}
    assert JsrunEnvironment(one_host).main_address == "127.0.0.1"


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(WorkerEnvError, match="JSM_NAMESPACE_LOCAL_RANK=2 is not below JSM_NAMESPACE_LOCAL_SIZE=2"):
        JsrunEnvironment({**JSRUN, "JSM_NAMESPACE_LOCAL_RANK": "2", "MASTER_ADDR": "h"})


def test_lsf_host_lists(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("batch1\na01n01\na01n01\na01n02\n")
    assert lsf_hosts({"LSB_DJOB_HOSTFILE": str(hostfile)}) == ["batch1", "a01n01", "a01n01", "a01n02"]
    assert lsf_hosts({"LSB_MCPU_HOSTS": "h1 2 h2 1"}) == ["h1", "h1", "h2"]
    with pytest.raises(WorkerEnvError, match="LSB_MCPU_HOSTS='h1 2 h2' is not 'host slots"):
        lsf_hosts({"LSB_MCPU_HOSTS": "h1 2 h2"})
    with pytest.raises(WorkerEnvError, match=r"LSB_DJOB_HOSTFILE=.* cannot be read"):
        lsf_hosts({"LSB_DJOB_HOSTFILE": str(tmp_path / "missing")})
