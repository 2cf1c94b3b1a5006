"""Pattern 3 as the examples write it, unguarded: `if torch.cuda.device_count() < world_size: print("Unable to
locate sufficient ..."); exit()`. On a machine without GPUs every rank prints the message and exits 0 before it
joins any process group: a job that ends at once, and successfully, under either launcher.

Where every rank sees enough GPUs (torchrun, or ddpboot --isolation node, on a machine with world_size GPUs; one
rank on one GPU), the script goes on as the examples do: set_device(LOCAL_RANK), nccl, one all_reduce, and a result
in $CORPUS_OUT (tests/gpu/test_gpu_corpus.py)."""

import os

import torch

if __name__ == "__main__":
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.device_count() < world_size:
        print(f"Unable to locate sufficient {world_size} gpus to run this example. Exiting.")
        exit()
    import torch.distributed as dist
    from corpus_results import gpu_uuid, init_group, leave, write_result

    device = init_group("cuda")
    total = torch.ones(1, device=device)
    dist.all_reduce(total)
    write_result(dist.get_rank(), world_size=dist.get_world_size(), backend=dist.get_backend(),
                 cuda_devices=torch.cuda.device_count(), all_reduce=total.item(), gpu=gpu_uuid(device))
    dist.destroy_process_group()
    leave()
