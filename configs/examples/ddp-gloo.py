"""PyTorch DistributedDataParallel on CPUs with the gloo backend: the script ddp-gloo.yaml runs.

corral starts one process per (simulated or real) GPU and gives each the variables of
PyTorch's env:// rendezvous (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK), and
GLOO_SOCKET_IFNAME, the interface that holds the node's advertised address. So the script
calls init_process_group with nothing but the backend: no torchrun, no flags, and gloo
does not fall back to the address the hostname resolves to (often 127.0.0.1).

It trains a small model on a synthetic dataset for a few steps, then checks that every
rank ends with the same parameters (DDP averages the gradients, so they must be equal),
prints one JSON line, and exits 1 if they differ.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES = 1003  # not a multiple of the world size: DistributedSampler(drop_last=True) evens it out
FEATURES = 16
BATCH_SIZE = 16  # per process: the global batch is BATCH_SIZE x WORLD_SIZE
EPOCHS = 2
BASE_LR = 0.01


def main():
    dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank()
    world = dist.get_world_size()

    # The same dataset everywhere (same seed); each rank trains on its own share of it.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x @ torch.randn(FEATURES, 1, generator=generator) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    dataset = TensorDataset(x, y)
    # drop_last: every rank gets the same number of batches. A rank with one batch more
    # would wait forever in an all-reduce the others never join.
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, drop_last=True)

    # A different initialisation on every rank on purpose: DDP broadcasts rank 0's.
    torch.manual_seed(1000 + rank)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    # Linear scaling: the global batch grows with the world size, so does the step.
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR * world)
    loss_fn = torch.nn.MSELoss()

    steps = 0
    loss = torch.tensor(0.0)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()  # gradients are averaged over all ranks here
            optimizer.step()
            steps += 1

    # Every rank must hold exactly the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)

    print(
        json.dumps(
            {
                "check": "ddp-gloo",
                "rank": rank,
                "world_size": world,
                "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
                "master_addr": os.environ.get("MASTER_ADDR"),
                "master_port": int(os.environ.get("MASTER_PORT", "0")),
                "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
                "samples_per_rank": len(sampler),
                "steps": steps,
                "loss": round(float(loss), 6),
                "parameters": flat.numel(),
                "parameter_sum": float(flat.double().sum()),
                "identical": identical,
                "ok": identical,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
