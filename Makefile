# Set-up and everyday commands. `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build installed into a fresh environment. On a machine without GPUs this pin takes the CPU wheel
# where one is provided locally; elsewhere pip takes the standard (CUDA) build of the same release. An existing
# torch in the environment is kept: override with `make TORCH_SPEC='torch==X' venv` or reuse an environment
# that has torch already with `make VENV=/path/to/env`.
TORCH_SPEC ?= torch==2.13.0
NPROC ?= 2
# pytest-xdist workers for `make test`: much of the suite waits (for ranks to start, for deadlines), so on a 2-core
# machine two workers leave a core idle much of the time and four keep both busy (benchmarks/RESULTS.md gives the
# suite's time per tier and worker count). Each file runs in one worker, in order
# (tests/conftest.py keeps the files that share the SLURM cluster or the GPUs in one worker).
TEST_WORKERS ?= 4

.PHONY: venv demo test test-unit test-gpu lint typecheck check bench bench-slurm clean

$(VENV)/.ddpboot-installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.ddpboot-installed

# The main job: a real DDP training run through the launcher (NCCL on GPUs, gloo on CPU where there are none).
demo: venv
	$(VENV)/bin/ddpboot gpus
	$(VENV)/bin/ddpboot plan --nproc $(NPROC)
	$(VENV)/bin/ddpboot --nproc $(NPROC) examples/train.py

# As root (CI), the SLURM tests get a real eight-node cluster on this machine (scripts/ci/slurm-up: its own directory,
# config, ports and munged, beside any real SLURM installation), stopped afterwards whatever the result; elsewhere,
# or with DDPBOOT_NO_SLURM=1, they skip and say why. If the cluster cannot start, the other tests still run (the
# SLURM tests skip) and make fails at the end.
# In the same way the MPI tests get Open MPI and MPICH (scripts/ci/mpi-up installs Debian's openmpi-bin and mpich when
# missing; DDPBOOT_NO_MPI=1 skips it); if that fails, the MPI tests skip and make fails at the end.
# And the tests of jobs of several hosts get Debian's OpenSSH server (scripts/ci/sshd-up installs openssh-server when
# missing; the tests start their own sshd on 127.0.0.2 and 127.0.0.3; DDPBOOT_NO_SSHD=1 skips it), the same way.
WITH_SLURM = [ "$$(id -u)" = 0 ] && [ "$${DDPBOOT_NO_SLURM:-}" != 1 ]
WITH_MPI = [ "$$(id -u)" = 0 ] && [ "$${DDPBOOT_NO_MPI:-}" != 1 ]
WITH_SSHD = [ "$$(id -u)" = 0 ] && [ "$${DDPBOOT_NO_SSHD:-}" != 1 ]
test: venv
	@up=0; mpi=0; sshd=0; if $(WITH_SLURM); then scripts/ci/slurm-up || up=$$?; fi; \
	if $(WITH_MPI); then scripts/ci/mpi-up || mpi=$$?; fi; \
	if $(WITH_SSHD); then scripts/ci/sshd-up || sshd=$$?; fi; \
	rc=0; $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile || rc=$$?; if $(WITH_SLURM); then scripts/ci/slurm-down; fi; \
	if [ $$up != 0 ]; then echo "make test: scripts/ci/slurm-up failed (exit $$up): the SLURM tests skipped" >&2; \
	[ $$rc != 0 ] || rc=$$up; fi; \
	if [ $$mpi != 0 ]; then echo "make test: scripts/ci/mpi-up failed (exit $$mpi): the MPI tests skipped" >&2; \
	[ $$rc != 0 ] || rc=$$mpi; fi; \
	if [ $$sshd != 0 ]; then echo "make test: scripts/ci/sshd-up failed (exit $$sshd): the ssh tests skipped" >&2; \
	[ $$rc != 0 ] || rc=$$sshd; fi; exit $$rc

test-unit: venv
	$(PY) -m pytest -q tests/unit

test-gpu: venv
	$(PY) -m pytest -q -m gpu

# ruff (mccabe 12 included), the layers (import-linter's contracts in pyproject.toml), dead code (vulture).
lint: venv
	$(VENV)/bin/ruff check ddpboot tests benchmarks examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture

typecheck: venv
	$(VENV)/bin/mypy

check: lint typecheck test

bench: venv
	$(PY) benchmarks/run.py

# 2- and 8-node SLURM jobs, sbatch → exit, ddpboot vs torchrun (starts the local test cluster as root if none is up).
bench-slurm: venv
	$(PY) benchmarks/bench_slurm.py --append benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
