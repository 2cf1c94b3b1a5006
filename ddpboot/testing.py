"""`ddpboot.testing`: run a pytest test on N ranks through the ddpboot launcher.

    import pytest

    @pytest.mark.ddp(nproc=2)                 # CPU ranks with gloo unless GPUs are asked for
    def test_all_reduce(ddp_ctx):
        import torch, torch.distributed as dist
        t = torch.ones(1, device=ddp_ctx.device) * (ddp_ctx.rank + 1)
        dist.all_reduce(t)
        assert t.item() == 3

    @pytest.mark.ddp(nproc=2, device="gpu")   # skipped, with the reason, on a machine with fewer than 2 GPUs

The plugin is registered through the `pytest11` entry point, so installing ddpboot is enough. In the pytest
process the marked test is replaced by one launcher run (`python -m ddpboot --nproc N ...`); every rank imports
the test's module, calls `ddpboot.init()` and runs the function, passing the Context as `ddp_ctx` if the function
asks for it (no other fixtures reach the ranks). A rank that fails writes its traceback; the test fails with every
failing rank's traceback in the report. Marker arguments: `nproc` (default 2), `device` ("cpu", "gpu" or "auto":
GPUs when the machine has enough, else CPU), `timeout` (seconds for the whole run, default 120), `args` (extra
launcher options, e.g. ["--isolation", "node"]).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import pytest

RUNNER_ENV = "DDPBOOT_TESTING_RESULTS"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ddp(nproc=2, device='cpu'|'gpu'|'auto', timeout=120, args=[]): run the test on N ranks"
    )


@pytest.fixture
def ddp_ctx() -> None:
    """The rank's ddpboot Context inside the ranks; in the pytest process it is never used."""
    return None


def _gpu_count() -> int:
    """GPUs of the machine through NVML, without CUDA (the pytest process must stay CUDA-free)."""
    from ddpboot.selection.inventory import load_inventory

    return len(load_inventory().units())


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("ddp")
    if marker is None:
        return None
    opts: dict[str, Any] = {"nproc": 2, "device": "cpu", "timeout": 120.0, "args": ()}
    opts.update(marker.kwargs)
    if marker.args:
        opts["nproc"] = marker.args[0]
    nproc, device = int(opts["nproc"]), str(opts["device"])
    if device not in ("cpu", "gpu", "auto"):
        raise pytest.UsageError(f"@pytest.mark.ddp(device={device!r}): choose cpu, gpu or auto")
    gpus = _gpu_count() if device != "cpu" else 0
    if device == "gpu" and gpus < nproc:
        pytest.skip(f"needs {nproc} GPUs for {nproc} ranks; this machine has {gpus}")
    use_gpus = device == "gpu" or (device == "auto" and gpus >= nproc)
    path = Path(str(pyfuncitem.path))
    with tempfile.TemporaryDirectory(prefix="ddpboot-testing-") as results:
        cmd = [
            sys.executable, "-m", "ddpboot", "--nproc", str(nproc), *([] if use_gpus else ["--cpu"]),
            "--shutdown-timeout", "5", *map(str, opts["args"]),
            "-m", "ddpboot.testing", str(path), pyfuncitem.originalname,
        ]
        env = {**os.environ, RUNNER_ENV: results}
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=float(opts["timeout"]))
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the {nproc}-rank run did not finish within {opts['timeout']} s\n{_text(exc.stdout)}"
                        f"{_text(exc.stderr)}", pytrace=False)
        failures = []
        for f in sorted(Path(results).glob("rank*.json"), key=lambda p: int(p.stem[4:])):
            rec = json.loads(f.read_text())
            if not rec["passed"]:
                failures.append(f"--- rank {rec['rank']} failed ---\n{rec['traceback']}")
        if failures or out.returncode != 0:
            detail = "\n".join(failures) or f"launcher output:\n{out.stdout}\n{out.stderr}"
            pytest.fail(f"{len(failures)} of {nproc} ranks failed (exit code {out.returncode})\n{detail}",
                        pytrace=False)
    return True


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _run_rank(path: str, name: str) -> int:
    """Inside a rank: import the test module by path, run the function, record the outcome."""
    import ddpboot

    results = Path(os.environ[RUNNER_ENV])
    rank = int(os.environ.get("RANK", "0"))
    record: dict[str, Any] = {"rank": rank, "passed": False, "traceback": ""}
    try:
        ctx = ddpboot.init()
        module_path = Path(path)
        sys.path.insert(0, str(module_path.parent))
        spec = importlib.util.spec_from_file_location(f"_ddp_test_{module_path.stem}", module_path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, name)
        fn = getattr(fn, "__wrapped__", fn)
        kwargs = {"ddp_ctx": ctx} if "ddp_ctx" in inspect.signature(fn).parameters else {}
        fn(**kwargs)
        record["passed"] = True
    except BaseException:  # every failure, assertion or crash, is this rank's result
        record["traceback"] = traceback.format_exc()
    (results / f"rank{rank}.json").write_text(json.dumps(record))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(_run_rank(sys.argv[1], sys.argv[2]))
