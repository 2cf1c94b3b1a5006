"""How a rank runs its target (ddpboot/launch/pymain.py): the kinds' command lines and python's sys.path[0] rule.
What a rank then sees is compared with plain python in tests/process/test_bootstrap.py (exec'd) and
tests/process/test_fast_start.py (forked)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.contract import STACKS_VAR
from ddpboot.launch import pymain
from ddpboot.launch.pymain import RUN_PATH_CODE, TargetKind, absolute, exit_code, main_importer, path0

PY = "/opt/py/bin/python3"


def test_each_kind_shows_the_command_torchrun_runs() -> None:
    args = ("--lr", "3")
    assert TargetKind.SCRIPT.shown(PY, "train.py", args) == [PY, "-u", "train.py", "--lr", "3"]
    assert TargetKind.MODULE.shown(PY, "pkg.train", args) == [PY, "-u", "-m", "pkg.train", "--lr", "3"]
    assert TargetKind.RUN_PATH.shown(PY, "/t.py", args) == [PY, "-u", "-c", RUN_PATH_CODE, "/t.py", "--lr", "3"]
    assert TargetKind.BINARY.shown(PY, "/bin/echo", args) == ["/bin/echo", "--lr", "3"]
    assert [k.is_python for k in TargetKind] == [True, True, True, False]
    assert str(TargetKind.RUN_PATH) == f"{TargetKind.RUN_PATH}" == "run_path" == TargetKind("run_path")


@given(st.sampled_from(list(TargetKind)), st.text(min_size=1, max_size=8),
       st.lists(st.sampled_from(["-m", "-u", "-c", "x", ""]), max_size=4))
def test_the_words_give_back_the_target(kind: TargetKind, name: str, args: list[str]) -> None:
    """Arguments that look like python's own options (`-m`, `-c`) stay the target's."""
    assert kind.target_of(kind.words(name, args)) == (name, args)


def test_sys_path0_is_python_s(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text("")
    (tmp_path / "link.py").symlink_to(tmp_path / "real" / "train.py")
    (tmp_path / "app").mkdir()
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", "")
    cwd, real = str(tmp_path), os.path.realpath(tmp_path)
    assert path0("script", "link.py", cwd) == os.path.join(real, "real")  # the script's real directory
    assert path0("script", str(tmp_path / "real" / "train.py")) == os.path.join(real, "real")
    assert path0("script", "app", cwd) == str(tmp_path / "app")  # a directory or a zip file is its own
    assert path0("script", "app.zip", cwd) == str(tmp_path / "app.zip")
    assert path0("script", "missing.py", cwd) == real  # python's rule for a name it will not find either
    assert path0("module", "pkg.train", cwd) == cwd
    assert path0("module", "pkg.train") == os.getcwd()
    assert path0("run_path", str(tmp_path / "link.py"), cwd) == ""  # `-c`'s


def test_a_script_path_is_made_absolute_as_python_does(tmp_path: Path) -> None:
    assert absolute("../x.py", "/w/d") == "/w/d/../x.py"  # joined, not normalised
    assert absolute("/abs/x.py", "/w") == "/abs/x.py"
    (tmp_path / "app").mkdir()
    (tmp_path / "plain.py").write_text("")
    assert main_importer(str(tmp_path / "app")) is not None
    assert main_importer(str(tmp_path / "plain.py")) is None
    assert main_importer(str(tmp_path / "plain.py")) is None  # cached, as python caches it


@pytest.mark.parametrize(("code", "out"), [(None, 0), (3, 3), (256 + 7, 7), (True, 1), ("bye", 1)])
def test_system_exit_codes_as_cpython_reads_them(code: object, out: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(SystemExit(code)) == out
    assert capsys.readouterr().err == ("bye\n" if code == "bye" else "")


def test_the_stacks_variable_is_the_contracts() -> None:
    assert pymain.STACKS_VAR == STACKS_VAR


def test_the_module_imports_nothing_but_the_standard_library() -> None:
    """It runs in ranks that do not carry ddpboot: its source is all they get."""
    source = Path(pymain.__file__).read_text()
    imported = {line.split()[1].split(".")[0] for line in source.splitlines()
                if line.lstrip().startswith(("import ", "from ")) and " __future__ " not in line + " "}
    assert imported <= {"contextlib", "os", "sys", "enum", "collections", "types", "typing", "runpy",
                        "faulthandler", "atexit", "signal", "time", "functools", "importlib", "__future__"}, imported


def test_the_phases_suffix_is_the_contracts() -> None:
    from ddpboot.contract import phases_file

    assert str(phases_file("/x/error.json")) == "/x/error.json" + pymain.PHASES_SUFFIX


FAKE_TORCH = {
    "torch/__init__.py": "import time\nfrom torch import cuda, distributed\ntime.sleep(0.3)\n",
    "torch/cuda.py": "ready = []\ndef is_initialized():\n    return bool(ready)\n"
                     "def _lazy_init():\n    if not ready:\n        __import__('time').sleep(0.2)\n"
                     "        ready.append(1)\n",
    "torch/distributed/__init__.py": "from torch.distributed.distributed_c10d import init_process_group\n",
    "torch/distributed/distributed_c10d.py": "calls = []\ndef init_process_group(backend=None):\n"
                                             "    'the docstring'\n    calls.append(backend)\n    return backend\n",
}


def test_a_rank_s_start_up_marks_around_torch_s_import_its_cuda_context_and_its_group(tmp_path: Path) -> None:
    """A package named torch (the shape of torch's names) imported by a fresh interpreter after record_phases: the
    marks in order, the wrappers gone after their first call, the functions' own names and results kept."""
    import subprocess
    import sys

    for name, text in FAKE_TORCH.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    error_file = tmp_path / "error.json"
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); exec(open({pymain.__file__!r}).read()); "
            f"record_phases({str(error_file)!r}); import torch, torch.distributed as dist; import time; "
            "time.sleep(0.1); torch.cuda._lazy_init(); wrapped = dist.init_process_group; "
            "assert wrapped.__doc__ == 'the docstring' and wrapped('gloo') == 'gloo'; "
            "from torch.distributed import distributed_c10d as c; "
            "assert dist.init_process_group is c.init_process_group is not wrapped; "
            "assert torch.cuda._lazy_init.__module__ == 'torch.cuda' and not hasattr(torch.cuda._lazy_init, "
            "'__wrapped__'); assert c.calls == ['gloo']")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    lines = [ln.split() for ln in (tmp_path / ("error.json" + pymain.PHASES_SUFFIX)).read_text().splitlines()]
    names, times = [n for n, _ in lines], [float(t) for _, t in lines]
    assert names == ["up", "torch", "cuda_start", "cuda", "pg_start", "pg"]
    assert times == sorted(times) and times[1] - times[0] >= 0.3 and times[3] - times[2] >= 0.2


def test_no_marks_without_an_error_file(tmp_path: Path) -> None:
    before = list(__import__("sys").meta_path)
    pymain.record_phases("")
    assert __import__("sys").meta_path == before
