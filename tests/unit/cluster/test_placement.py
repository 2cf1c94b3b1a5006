"""Node ranks from where the ranks run (cluster/placement.py), for the placements a hostfile can give."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.cluster.placement import Where, host_identity, place
from ddpboot.errors import WorkerEnvError


def test_round_robin_hosts_are_nodes_by_their_lowest_rank() -> None:
    # a Hydra hostfile without `:N`: ranks 0 and 2 on hostA, 1 and 3 on hostB
    ranks = [Where("hostA", 0, 2), Where("hostB", 0, 2), Where("hostA", 1, 2), Where("hostB", 1, 2)]
    assert [tuple(place(ranks, r, "mpirun")) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_uneven_hosts() -> None:
    ranks = [Where("hostA", 0, 2), Where("hostA", 1, 2), Where("hostB", 0, 1)]
    assert [tuple(place(ranks, r, "mpirun")) for r in range(3)] == [(0, 2), (0, 2), (1, 2)]


def test_blocks_and_one_host() -> None:
    ranks = [Where(h, i, 2) for h in ("a", "b", "c") for i in range(2)]
    assert [place(ranks, r, "mpirun").node_rank for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert place([Where("a", 0, 2), Where("a", 1, 2)], 1, "mpirun") == (0, 1)


def test_hosts_that_contradict_the_launcher_are_refused() -> None:
    # two machines with the same name and boot id cannot be told apart: MPI says 2 nodes of 1
    ranks = [Where("same", 0, 1), Where("same", 0, 1)]
    with pytest.raises(WorkerEnvError, match=r"contradict mpirun's local ranks \(rank 0 on same is local rank 0 of "
                       r"1 for mpirun, but rank 0 of the 2 ranks there \(0, 1\); rank 1 on same .*own name"):
        place(ranks, 0, "mpirun")


def test_a_host_is_its_name_and_boot_id(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    name = host_identity(str(boot))
    assert name.endswith(" 1234-abcd") and name.split(" ")[0]
    assert " " not in host_identity(str(tmp_path / "missing"))
