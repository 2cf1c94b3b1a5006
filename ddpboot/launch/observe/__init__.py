"""Everything that watches a running job, in one room: the stack dumps and their verdict (stacks/), the GPU watch
(gpuwatch.py), the status file that `ddpboot top` reads (status.py) and --stall-timeout's notion of progress
(stall.py)."""
