"""Environments from other packages: entry points of `ddpboot.environments`, read from a real dist-info on sys.path,
asked after the built-in ones; a broken one is skipped with a message naming it."""

from __future__ import annotations

import importlib.metadata
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpboot.cluster import TorchrunEnvironment, detect_environment, plugin_failures
from ddpboot.cluster.plugins import GROUP, installed_plugins, load_plugins

PLUGIN = textwrap.dedent('''
    from ddpboot.cluster.base import ClusterEnvironment, read_int

    class FluxEnvironment(ClusterEnvironment):
        name = "flux"

        @classmethod
        def detect(cls, env):
            return "FLUX_TASK_RANK" in env

        def __init__(self, env):
            _, self._rank = read_int(env, "FLUX_TASK_RANK", "flux sets it")
            _, self._world_size = read_int(env, "FLUX_JOB_SIZE", "flux sets it", minimum=1)
            self._local_rank, self._local_world_size, self._node_rank, self._nnodes = 0, 1, self._rank, self._world_size
            self._main_address, self._main_port = "10.0.0.1", 29500

    NotAnEnvironment = 42
''')


def install(tmp: Path, entry_points: str, module: str = PLUGIN) -> None:
    """A package `site_envs` and the dist-info that declares `entry_points`, as pip would leave them."""
    (tmp / "site_envs.py").write_text(module)
    info = tmp / "site_envs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-envs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entry_points}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for one test; the process's cached plugin list is forgotten before and after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    installed_plugins.cache_clear()
    yield tmp_path
    installed_plugins.cache_clear()


def entry_points_in(path: Path) -> list[importlib.metadata.EntryPoint]:
    return [ep for d in importlib.metadata.distributions(path=[str(path)]) for ep in d.entry_points
            if ep.group == GROUP]


def test_an_installed_entry_point_is_detected_after_the_built_in_ones(site: Path) -> None:
    install(site, "flux = site_envs:FluxEnvironment")
    flux = {"FLUX_TASK_RANK": "3", "FLUX_JOB_SIZE": "4"}
    env = detect_environment(flux)
    assert env is not None and (env.name, env.global_rank, env.world_size, env.node_rank) == ("flux", 3, 4, 3)
    assert plugin_failures() == ()
    # a process that a built-in environment recognises is read by it, whatever the plugin says
    both = {**flux, "TORCHELASTIC_RUN_ID": "x", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    assert isinstance(detect_environment(both), TorchrunEnvironment)


def test_broken_entry_points_are_skipped_and_named(site: Path) -> None:
    install(site, "\n".join([
        "a_missing = site_envs_missing_module:Env",
        "b_int = site_envs:NotAnEnvironment",
        "c_base = ddpboot.cluster.base:ClusterEnvironment",
        "d_flux = site_envs:FluxEnvironment",
    ]))
    loaded = load_plugins(entry_points_in(site))
    assert [cls.__name__ for cls in loaded.environments] == ["FluxEnvironment"]
    missing, not_env, abstract = loaded.failures
    assert "a_missing = 'site_envs_missing_module:Env'" in missing and "ModuleNotFoundError" in missing
    assert "declared by site-envs 1.0" in missing and "skipped" in missing and "Fix:" in missing
    assert "b_int" in not_env and "42, which is not a ClusterEnvironment subclass" in not_env
    assert "c_base" in abstract and "abstract" in abstract
    # read through the installed metadata: detection still works, the failures are kept for init() to report
    assert detect_environment({"FLUX_TASK_RANK": "0", "FLUX_JOB_SIZE": "1"}) is not None
    assert plugin_failures() == loaded.failures


def test_entry_points_are_read_only_when_no_built_in_environment_matched(site: Path) -> None:
    install(site, "a_missing = site_envs_missing_module:Env")
    torchrun = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "h",
                "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}
    assert detect_environment(torchrun) is not None
    assert installed_plugins.cache_info().currsize == 0 and plugin_failures() == ()
    assert detect_environment({}) is None
    assert len(plugin_failures()) == 1


def test_plugins_given_explicitly_keep_detection_pure() -> None:
    assert detect_environment({"FLUX_TASK_RANK": "0"}, plugins=[]) is None
