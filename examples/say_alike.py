"""Every rank prints the same lines, as DDP scripts print a warning or an all-reduced loss: ddpboot shows each once,
naming the ranks (docs/guide.md, "Lines every rank prints alike").

    ddpboot --cpu --nproc 4 examples/say_alike.py                  # [rank0-3]: ... once
    ddpboot --cpu --nproc 4 --no-collapse examples/say_alike.py    # every rank's copy

The warning goes to stderr, the loss to stdout; each is collapsed on its own stream.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    loss = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(loss)  # the ranks leave it together, each with the same sum
    warnings.warn("this script uses a deprecated option", UserWarning, stacklevel=1)
    print(f"mean loss over {dist.get_world_size()} ranks: {loss.item() / dist.get_world_size():.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
