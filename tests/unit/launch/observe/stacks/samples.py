"""Stack dumps as py-spy and faulthandler print them, shared by the summary's and the verdict's tests."""

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed"

PYSPY_BARRIER = f"""Process 5588: /venv/bin/python3 -u /jobs/hang_job.py barrier
Python v3.11.7 (/usr/bin/python3.11)

Thread 5588 (idle): "MainThread"
    barrier ({TORCH}/distributed_c10d.py:5356)
    _exception_logger.<locals>.wrapper ({TORCH}/c10d_logger.py:83)
    barrier (/jobs/hang_job.py:23)
    main (/jobs/hang_job.py:46)
    <module> (/jobs/hang_job.py:50)
Thread 5601 (idle): "data-loader"
    wait (/usr/lib/python3.11/threading.py:320)
"""

PYSPY_SLEEPING = """Thread 5589 (active+gil): "MainThread"
    sleep_elsewhere (/jobs/hang_job.py:18)
    barrier (/jobs/hang_job.py:25)
    <module> (/jobs/hang_job.py:50)
"""

FAULTHANDLER_RECV = f"""Thread 0x00007f40b0bff640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f40c447cb80 (most recent call first):
  File "{TORCH}/distributed_c10d.py", line 2799 in recv
  File "{TORCH}/c10d_logger.py", line 83 in wrapper
  File "/jobs/hang_job.py", line 39 in deadlock
  File "/jobs/hang_job.py", line 50 in <module>
  File "/ddpboot/launch/faststart/zygote.py", line 182 in _run_target
"""

FAULTHANDLER_DESTROY = """Current thread 0x00007fda201bdb80 (most recent call first):
  File "/jobs/job.py", line 10 in <module>
"""

PYSPY_RENDEZVOUS = f"""Thread 77 (idle): "MainThread"
    _create_c10d_store ({TORCH}/rendezvous.py:198)
    _env_rendezvous_handler ({TORCH}/rendezvous.py:275)
    init_process_group ({TORCH}/distributed_c10d.py:1710)
    init (/ddpboot/worker/start.py:50)
    main (/jobs/train.py:7)
"""

PYSPY_SYNCHRONIZE = """Thread 496 (active): "MainThread"
    synchronize (/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:1162)
    <module> (/jobs/hang.py:11)
"""  # an NCCL rank whose peer left the all_reduce it queued (two single-GPU nodes, NCCL's socket transport)

FAULTHANDLER_ITEM = """Current thread 0x00007fda201bdb80 (most recent call first):
  File "/jobs/train.py", line 30 in step
  File "/jobs/train.py", line 40 in <module>
"""
