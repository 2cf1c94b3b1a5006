"""The `ddp` marker's arguments and which sizes a machine can run."""

from __future__ import annotations

import pytest

from ddpboot.testing.options import MarkerError, parse_marker, skip_reason, uses_gpus


def test_defaults_and_lists() -> None:
    assert parse_marker((), {}).sizes == (2,)
    assert parse_marker((4,), {}).sizes == (4,)
    opts = parse_marker((), {"nproc": [1, 2, 2, 4], "device": "auto", "timeout": 30, "args": ["--isolation", "node"]})
    assert (opts.sizes, opts.device, opts.timeout, opts.args, opts.matrix) == (
        (1, 2, 4), "auto", 30.0, ("--isolation", "node"), True)
    assert not parse_marker((), {"nproc": 3}).matrix


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"nproc": 0}, "nproc=0"),
    ({"nproc": []}, "nproc=[]"),
    ({"nproc": True}, "nproc=True"),
    ({"nproc": "2"}, "nproc='2'"),
    ({"device": "tpu"}, "choose cpu, gpu or auto"),
    ({"timeout": 0}, "timeout=0"),
    ({"args": "--isolation node"}, "list of launcher options"),
    ({"nprocs": 2}, "got nprocs"),
])
def test_bad_arguments_are_named(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(MarkerError, match=None) as err:
        parse_marker((), kwargs)
    assert says in str(err.value)


def test_skip_reasons() -> None:
    assert skip_reason("gpu", 2, 1, 8) == "needs 2 GPUs for 2 ranks; this machine has 1"
    assert skip_reason("gpu", 2, 2, 8) is None
    assert skip_reason("cpu", 33, 8, 2) == "needs 33 CPU ranks, more than 16 per core on this machine's 2 cores"
    assert skip_reason("cpu", 32, 0, 2) is None
    assert skip_reason("auto", 33, 0, 2) is not None  # too few GPUs: CPU ranks, and too many of them
    assert uses_gpus("auto", 2, 2) and not uses_gpus("auto", 3, 2) and not uses_gpus("cpu", 1, 8)
