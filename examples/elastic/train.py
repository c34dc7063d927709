"""An elastic torchrun trainer that commits its state and resumes after every resize.

Run by the workers of an ElasticJob (see elasticjob.yaml beside this file): the controller sets
PET_NNODES=min:max, PET_RDZV_ENDPOINT (a c10d store in its own pod, so losing worker 0 loses
nothing) and PET_NPROC_PER_NODE, so the container's command is just `torchrun train.py`.

When the job grows or shrinks, torchrun stops every worker process and starts a new round with
the new world size. The script therefore keeps all of its progress in a checkpoint on shared
storage (CHECKPOINT, e.g. a PVC or a bucket mount): it saves after every epoch and on SIGTERM
(a worker being removed gets its pod's termination grace period to do so) and loads the latest
checkpoint when it starts. The data sampler is rebuilt for the new world size, so every sample
is still seen once per epoch. Not run in CI (it needs torch and GPUs).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CHECKPOINT = Path(os.environ.get("CHECKPOINT", "/checkpoints/state.pt"))
EPOCHS = int(os.environ.get("EPOCHS", "20"))
stop_requested = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True  # finish the current step, commit, exit


def save(model: torch.nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    if dist.get_rank() != 0:
        return
    tmp = CHECKPOINT.with_suffix(".tmp")
    CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, tmp)
    tmp.replace(CHECKPOINT)  # atomic: a reader never sees half a checkpoint


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(32, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if CHECKPOINT.exists():
        state = torch.load(CHECKPOINT, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    ddp = DistributedDataParallel(model, device_ids=[local] if device.type == "cuda" else None)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    sampler = DistributedSampler(data)  # world size of this round, not of the first one
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()} resumes at epoch {start}", flush=True)
    for epoch in range(start, EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            if stop_requested:
                break
        save(model, opt, epoch if not stop_requested else epoch - 1)
        if stop_requested:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
