"""The summary line from stack texts captured from real hung gloo ranks (py-spy 0.4 and faulthandler, Python 3.11,
torch 2.13)."""

from __future__ import annotations

from ddpboot.launch.observe.stacks.summary import describe, parse, without_launch_frames
from tests.unit.launch.observe.stacks.samples import (
    FAULTHANDLER_DESTROY,
    FAULTHANDLER_ITEM,
    FAULTHANDLER_RECV,
    PYSPY_BARRIER,
    PYSPY_RENDEZVOUS,
    PYSPY_SLEEPING,
    PYSPY_SYNCHRONIZE,
)


def test_py_spy_names_the_collective_and_the_scripts_caller() -> None:
    threads = parse(PYSPY_BARRIER)
    assert [t.name for t in threads] == ["MainThread", "data-loader"] and threads[0].main
    assert describe(threads) == "barrier, called from hang_job.py:23 in barrier"


def test_a_rank_outside_torch_distributed_shows_its_innermost_frame() -> None:
    assert describe(parse(PYSPY_SLEEPING)) == "not in torch.distributed: sleep_elsewhere at hang_job.py:18"


def test_faulthandler_text_main_thread_is_the_one_running_module() -> None:
    threads = parse(FAULTHANDLER_RECV)
    assert [t.main for t in threads] == [False, True]
    assert describe(threads) == "recv, called from hang_job.py:39 in deadlock"


def test_a_call_without_a_python_frame_is_named_from_the_source_line() -> None:
    lines = {("/jobs/job.py", 10): "    dist.destroy_process_group()"}
    text = describe(parse(FAULTHANDLER_DESTROY), lambda f, n: lines.get((f, n), ""))
    assert text == "destroy_process_group, called from job.py:10 in <module> (no Python frame of its own)"
    assert describe(parse(FAULTHANDLER_DESTROY)) == "not in torch.distributed: <module> at job.py:10"


def test_waiting_on_the_store_is_said_as_such() -> None:
    assert describe(parse(PYSPY_RENDEZVOUS)) == (
        "init_process_group (waiting on the store), called from train.py:7 in main")


def test_a_wait_for_the_gpu_is_named_with_the_collective_on_its_line() -> None:
    lines = {("/jobs/hang.py", 11): "    dist.all_reduce(t); torch.cuda.synchronize()",
             ("/jobs/train.py", 30): "    print(loss.item())"}
    text = describe(parse(PYSPY_SYNCHRONIZE), lambda f, n: lines.get((f, n), ""))
    assert text == ("synchronize (waiting for the GPU), called from hang.py:11 in <module>, "
                    "after all_reduce on that line")
    assert describe(parse(PYSPY_SYNCHRONIZE)) == "synchronize (waiting for the GPU), called from hang.py:11 in <module>"
    assert describe(parse(FAULTHANDLER_ITEM), lambda f, n: lines.get((f, n), "")) == (
        "item (waiting for the GPU), called from train.py:30 in step")
    assert describe(parse(FAULTHANDLER_ITEM)) == "not in torch.distributed: step at train.py:30"  # no source: unknown


def test_a_cpu_ranks_item_is_not_a_wait_for_the_gpu() -> None:
    """On a CPU rank (gloo) `.item()` waits for nothing: a collective on the same line is what blocks."""
    lines = {("/jobs/train.py", 30): "    dist.all_reduce(t, async_op=True).wait(); v = t.item()"}
    source = lambda f, n: lines.get((f, n), "")  # noqa: E731
    assert describe(parse(FAULTHANDLER_ITEM), source, gpu=False) == (
        "all_reduce, called from train.py:30 in step (no Python frame of its own)")
    assert describe(parse(FAULTHANDLER_ITEM), source).startswith("item (waiting for the GPU)")
    # torch.cuda.synchronize's own frame is a wait for the GPU whatever the rank was given
    assert describe(parse(PYSPY_SYNCHRONIZE), gpu=False).startswith("synchronize (waiting for the GPU)")


def test_no_frames() -> None:
    assert describe(parse("")) == "no Python frames"
    assert describe(parse("Thread 5 (idle): \"MainThread\"\n")) == "no Python frames"


BOOTSTRAPPED = """Process 7: /venv/bin/python -u -c exec(__import__("os").environ.pop("DDPBOOT_BOOTSTRAP")) -m job
Python v3.11.7 (/usr/bin/python3.11)

Thread 7 (idle): "MainThread"
    <module> (<string>:3)
    sleep_elsewhere (/jobs/job.py:6)
    <module> (/jobs/job.py:9)
    _run_code (<frozen runpy>:88)
    _run_module_as_main (<frozen runpy>:198)
    <lambda> (/venv/lib/python3.11/site-packages/ddpboot/launch/pymain.py:158)
    run_execd (/venv/lib/python3.11/site-packages/ddpboot/launch/pymain.py:211)
    <lambda> (<string>:2)
    <module> (<string>:2)
    <module> (<string>:1)
Thread 9 (idle): "worker"
    wait (/usr/lib/python3.11/threading.py:320)
"""


def test_the_frames_that_started_the_rank_are_left_out_of_its_stack() -> None:
    """Below the script: the bootstrap's frames go, python's own runpy frames of -m stay; a `<string>` frame of the
    script's own (an exec) above them stays too; the fast-start process's frames go."""
    shown = without_launch_frames(BOOTSTRAPPED)
    assert "pymain.py" not in shown and "(<string>:1)" not in shown and "(<string>:2)" not in shown
    assert "    <module> (<string>:3)\n" in shown and "_run_module_as_main (<frozen runpy>:198)\n" in shown
    assert shown.endswith('Thread 9 (idle): "worker"\n    wait (/usr/lib/python3.11/threading.py:320)')
    assert "zygote.py" not in without_launch_frames(FAULTHANDLER_RECV)
    assert 'line 50 in <module>' in without_launch_frames(FAULTHANDLER_RECV)
    alone = "Thread 3 (idle)\n    <module> (<string>:1)"
    assert without_launch_frames(alone) == alone  # nothing else to show: kept
