"""The CPUs of a launcher an MPI launcher bound (nodes/binding.py)."""

from __future__ import annotations

from pathlib import Path

from ddpboot.nodes.binding import cgroup_cpus, launcher_cpus

OMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
HYDRA = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}


def test_one_launcher_per_host_widens_a_core_binding_within_the_cgroup() -> None:
    cpus = launcher_cpus(OMPI, [0], list(range(16)), 8)
    assert cpus.cpus == tuple(range(16))
    assert cpus.note == ("the MPI launcher bound this ddpboot (Open MPI) to CPU 0, fewer than its 8 ranks (one core "
                         "each): they run on CPUs 0-15, all that this host allows it (mpirun --bind-to none starts "
                         "it unbound)")


def test_a_binding_that_fits_the_ranks_is_kept() -> None:
    assert launcher_cpus(OMPI, [0, 1, 2, 3], list(range(16)), 4).note is None  # a socket of 4 cores for 4 ranks
    assert launcher_cpus({}, [0], list(range(16)), 8).note is None  # no MPI: the affinity is the user's


def test_what_cannot_widen_says_which_flag_starts_it_unbound() -> None:
    shared = launcher_cpus({**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, [3], list(range(16)), 4)
    assert shared.cpus == (3,)
    assert "other ddpboot launchers of this job share this host" in (shared.note or "")
    assert "mpirun --bind-to none (Open MPI binds to a core for 2 processes or fewer" in (shared.note or "")
    pinned = launcher_cpus(HYDRA, [0], [0], 2)
    assert pinned.cpus == (0,) and "this host allows it no other CPUs" in (pinned.note or "")
    assert "I_MPI_PIN=0 (Intel MPI)" in (pinned.note or "")


def test_the_cgroup_cpuset(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    root = tmp_path / "cgroup"
    (proc / "self" / "cgroup").write_text("0::/job/step\n")
    (root / "job" / "step").mkdir(parents=True)
    (root / "job" / "step" / "cpuset.cpus.effective").write_text("0-3,8\n")
    assert cgroup_cpus(str(proc), str(root)) == [0, 1, 2, 3, 8]
    (proc / "self" / "cgroup").write_text("4:memory:/x\n3:cpuset:/slurm/job1\n")
    (root / "cpuset" / "slurm" / "job1").mkdir(parents=True)
    (root / "cpuset" / "slurm" / "job1" / "cpuset.effective_cpus").write_text("2-5\n")
    assert cgroup_cpus(str(proc), str(root)) == [2, 3, 4, 5]
    assert cgroup_cpus(str(tmp_path / "none"), str(root)) is None
