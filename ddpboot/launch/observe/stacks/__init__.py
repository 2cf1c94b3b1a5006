"""Where is every rank? The launcher's stack dumps: collect (py-spy, or the ranks' faulthandler), summarise (one
line per rank naming the collective, barrier or destroy_process_group it waits in), write (the log and the run
directory), and find a running job's launcher for `ddpboot stacks`.

collect.py: the backends. summary.py: pure parsing of stack texts and the summary line. dump.py: one dump, its
files and its console text. find.py: the running launchers' records and asking one of them for a dump.
"""
