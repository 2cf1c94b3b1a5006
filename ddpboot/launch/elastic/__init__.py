"""Elastic jobs: `--nnodes MIN:MAX` with torch's c10d rendezvous, torchrun's semantics, one Supervisor per round.

    ddpboot --nnodes 1:4 --nproc gpu --rdzv-backend c10d --rdzv-endpoint node01:29400 train.py

Every node runs this launcher with the same options. torch's c10d rendezvous (torch.distributed.elastic.rendezvous,
hosted on the endpoint's machine by that node's launcher) forms rounds of MIN..MAX nodes; each round gives this node
its group rank and the node count. Group rank 0 serves the round's worker store (ddpboot's own, as on one node) on
its --local-addr and a fresh port and publishes that address through the rendezvous store; global ranks follow
torchrun (each node's ranks come after those of the lower group ranks). Then a Supervisor runs the round's workers.

What ends a round (torchrun's rules):
- a node waiting to join (torch's num_nodes_waiting() > 0, asked every WATCH_INTERVAL s): the local workers are
  stopped and every node re-joins; membership changes never count against --max-restarts;
- a worker failure (on this node, or a peer's collective error after another node died): with restarts left, the
  group re-joins with TORCHELASTIC_RESTART_COUNT one higher; without, the launcher exits with the failing rank's
  exit code and closes the rendezvous so that the other nodes stop too;
- success: this node waits (up to EXIT_BARRIER s) until every node of the round has succeeded, closes the
  rendezvous and exits 0;
- a stop signal to the launcher: workers stopped, exit 128+N, the rendezvous left open (as torchrun).

The rendezvous handler imports torch and runs a keep-alive thread, which the launcher must not (it forks workers
and never imports torch): it lives in a child process, agent.py, spoken to over a socketpair (client.py).

GPU selection and locks happen once per launcher: each round's plan is the node's reserved plan with the round's
ranks, world size, node rank and node count (rounds.py). driver.py runs the rounds.
"""

from __future__ import annotations

from ddpboot.launch.elastic.driver import run_elastic

__all__ = ["run_elastic"]
