"""Pattern 7: Hugging Face accelerate as its README writes it: `Accelerator()`, `prepare`, a few steps with
`accelerator.backward`, `wait_for_everyone()`.

On a machine without GPUs accelerate joins the launcher's job only when asked for the CPU (`cpu=True`, which
`accelerate launch --cpu` sets through ACCELERATE_USE_CPU): a bare `Accelerator()` there runs every process on its
own (DistributedType.NO, each one "process 0 of 1") under torchrun and ddpboot alike. Hence the usual
`Accelerator(cpu=not torch.cuda.is_available())`; accelerate then finds the job (MULTI_CPU, gloo) by itself."""

import torch
import torch.distributed as dist
from accelerate import Accelerator
from corpus_results import checksum, leave, write_result
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(7)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 4, generator=torch.Generator().manual_seed(70)), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for inputs, targets in loader:
        optimizer.zero_grad()
        accelerator.backward(nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()
        steps += 1
    accelerator.wait_for_everyone()
    write_result(accelerator.process_index, world_size=accelerator.num_processes, backend=dist.get_backend(),
                 distributed_type=str(accelerator.distributed_type), device=str(accelerator.device),
                 steps=steps, checksum=checksum(accelerator.unwrap_model(model).parameters()))
    # accelerate leaves the group to the interpreter's exit, where a gloo group sometimes aborts (torch 2.13 CPU:
    # "terminate called without an active exception"): tear it down here.
    accelerator.end_training()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()
