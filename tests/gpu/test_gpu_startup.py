"""The start-up waterfall of a real 1-rank NCCL job: its table (status.json, while the job runs) has the CUDA
context's phase (torch.cuda._lazy_init's first call) and NCCL's init (NCCL's own "Init timings", from the init log
ddpboot has NCCL write beside the rank's error file with --log-dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.contract import nccl_init_file
from ddpboot.launch.observe.status import read_status
from ddpboot.launch.rundir import RunPaths
from tests.support import REPO, clean_env, finish, gpu_count, start_launcher, wait_for

pytestmark = pytest.mark.gpu
RANK = REPO / "tests" / "gpu" / "startup_rank.py"


def test_a_nccl_job_s_waterfall_has_the_cuda_context_and_nccl_init(tmp_path: Path) -> None:
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    logs, release = tmp_path / "logs", tmp_path / "release"
    proc = start_launcher(["--nproc-per-node", "1", "--log-dir", str(logs), "--rdzv-id", "w", str(RANK)],
                          clean_env(RELEASE_FILE=str(release)))
    try:
        def phased() -> dict[str, float] | None:
            st = read_status(logs / "w")
            phases = st.ranks[0].phases if st is not None and st.ranks else None
            return phases if phases and "nccl" in phases and "cuda" in phases else None

        phases = wait_for(phased, 180, "the CUDA and NCCL phases in status.json")
    finally:
        release.touch()
    code, _, err = finish(proc, 180)
    assert code == 0, err
    assert list(phases)[:4] == ["python", "imports", "cuda", "nccl"], phases
    assert 0.0 < phases["cuda"] < 120 and 0.0 < phases["nccl"] < 120, phases
    assert {"setup", "rendezvous"} <= set(phases), phases
    log = nccl_init_file(str(RunPaths(logs / "w").attempt(0).error_file(0)))
    assert "Init COMPLETE" in log.read_text(), "NCCL's init log"
    assert "NCCL INFO" not in err, "NCCL's messages stay out of the console"
