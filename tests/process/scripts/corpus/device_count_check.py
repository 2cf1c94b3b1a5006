"""Pattern 3 as the examples write it, unguarded: `if torch.cuda.device_count() < world_size: print("Unable to
locate sufficient ..."); exit()`. On a machine without GPUs every rank prints the message and exits 0 before it
joins any process group: a job that ends at once, and successfully, under either launcher."""

import os

import torch

if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.device_count() < world_size:
        print(f"Unable to locate sufficient {world_size} gpus to run this example. Exiting.")
        exit()
    raise SystemExit(f"{torch.cuda.device_count()} GPUs: this check is for machines with fewer than {world_size}")
