"""Which options every host's launcher gets (ddpboot/cli/hosts.py): the ones given here, on the command line or
through their variable, as flags again; the hosts' own options are set per host (launch/remote.py)."""

from __future__ import annotations

import pytest
from typer.main import get_command

from ddpboot.cli.hosts import forwarded_options
from ddpboot.cli.run import run_app


def context(args: list[str]) -> object:
    return get_command(run_app).make_context("ddpboot", args)


def test_the_given_options_go_to_every_host_as_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_MAX_RESTARTS", "0")  # through its variable: given too
    monkeypatch.delenv("DDPBOOT_FAST_START", raising=False)
    ctx = context(["--hostfile", "hosts", "--ssh-port", "2222", "--env", "A", "--env", "B=1", "--nproc", "2",
                   "--gpus", "0,1", "--master-port", "29600", "--cpu-affinity", "none", "--no-fast-start",
                   "--no-prefix", "--log-dir", "logs", "--dry-run", "--json", "train.py", "--epochs", "3"])
    assert forwarded_options(ctx) == ["--cpu-affinity", "none", "--no-fast-start", "--max-restarts", "0",
                                      "--log-dir", "logs", "--no-prefix"]


def test_nothing_given_is_nothing_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PET_MAX_RESTARTS", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    assert forwarded_options(context(["--hosts", "a,b", "train.py"])) == []
