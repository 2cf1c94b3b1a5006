"""The coercion that spares typer's pydantic layer answers exactly as typer's own, for every option of every command
and the values a command line and a variable give (left out, words, numbers, malformed numbers, lists), refusals
included; and `ddpboot plan` no longer imports pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command

from ddpboot.cli import coercion
from ddpboot.cli.run import run_app
from ddpboot.cli.tools import tools

VALUES: list[Any] = [None, "", "2", "0", "007", "-3", "+4", " 5", "5 ", "1_000", "2.0", "1e3", "x", "auto",
                     "99999999999999999999999", "1" * 18, 3, 0, True, False, 2.5, (), ("a",), ("a", "b"), ["c"],
                     ("1", 2), "yes", "off"]


def _params() -> list[Any]:
    out = []
    for app in (tools, run_app):
        command = get_command(app)
        commands = list(command.commands.values()) if isinstance(command, typer.core.TyperGroup) else [command]
        out += [p for c in commands for p in c.params if hasattr(p, "type_descriptor")]
    return out


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        got = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # the refusal, compared by its kind and its message
        return "refused", (type(exc).__name__, str(exc))
    return "value", (type(got).__name__, got)


@pytest.mark.skipif(not hasattr(typer.core, "build_runtime_param"), reason="a typer without the pydantic layer")
def test_every_option_is_coerced_as_typer_coerces_it() -> None:
    params = _params()
    assert len(params) > 60
    build = typer.core.build_runtime_param
    build = getattr(build, "typer_own", build)  # typer's own, also where a test before this one installed ours
    ctx = typer.Context(get_command(tools))
    answered = 0
    for param in params:
        known = coercion.KnownCoercion(param.type_descriptor, build)
        real = build(param.type_descriptor)
        for value in VALUES:
            mine = _outcome(known, value, param, ctx)
            assert mine == _outcome(real, value, param, ctx), (param.name, value)
            answered += known.real is None
    assert answered > 100  # most of them without typer's adapter


def test_install_is_idempotent_and_plan_imports_no_pydantic(tmp_path: Path) -> None:
    code = ("import sys\nfrom ddpboot.cli import coercion\nassert coercion.install() and coercion.install()\n"
            "from ddpboot.cli.app import main\ntry:\n    main(['plan', '--nproc', '2', '--json'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\nprint('pydantic' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPBOOT_")}
    root = str(Path(coercion.__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False"
