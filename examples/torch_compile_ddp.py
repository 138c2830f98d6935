"""``torch.compile(backend="tcc")`` under DistributedDataParallel: two CPU processes (gloo) train
a small model, each on its share of the batch, and after DDP's all-reduce each process's
gradients equal those of one eager process on the whole batch.

    python examples/torch_compile_ddp.py [--model mlp|gpt] [--nproc 2] [--steps 2]

DDP all-reduces gradients in buckets (1 MB the first, ``--bucket-mb`` the others) as the
backward pass produces them; Dynamo's DDP optimizer (``torch._dynamo.config.optimize_ddp``) cuts
the model's graph at the bucket boundaries, so that a bucket's all-reduce can start while the
rest of the backward runs, and hands each piece to the backend: both models here hold about
1.6 MB of parameters, so two pieces, each a forward and a backward graph for tcc.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch_compile_models import GPT, MLP

import tcc.torch

BATCH = 4  # split evenly between the processes
MODELS = {"mlp": (lambda: MLP(128, 512, 128), lambda g: torch.randn(BATCH, 128, generator=g)),
          "gpt": (lambda: GPT(vocab=37, d=128, heads=4, layers=2, context=9),
                  lambda g: torch.randint(0, 37, (BATCH, 9), generator=g))}


def loss_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def worker(rank: int, nproc: int, name: str, steps: int, bucket_mb: float, port: int) -> None:
    """One process: its share of each batch through the compiled DDP model; the gradients checked
    against one eager process on the whole batch."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    make, data = MODELS[name]
    try:
        torch.manual_seed(0)
        model = make()
        reference = copy.deepcopy(model)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        compiled = torch.compile(ddp, backend="tcc", dynamic=False)
        opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
        share = BATCH // nproc
        for step in range(steps):
            x = data(torch.Generator().manual_seed(step))
            opt.zero_grad()
            ref_opt.zero_grad()
            with tcc.torch.recording() as record:
                loss_of(compiled, x[rank * share:(rank + 1) * share]).backward()
            loss_of(reference, x[:share * nproc]).backward()
            err = max((p.grad - q.grad).abs().max().item() / (q.grad.abs().max().item() or 1.0)
                      for p, q in zip(model.parameters(), reference.parameters()))
            if rank == 0:
                print(f"DDP step {step}: {record.graphs} graph(s) compiled by tcc; gradients vs one eager process "
                      f"on the whole batch: max relative error {err:.2e}", flush=True)
            if err > 1e-4:
                raise SystemExit(f"rank {rank}: DDP gradients differ from one process's ({err:.2e})")
            opt.step()
            ref_opt.step()
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=1.0,
                        help="DDP's bucket size, at least its first bucket's (1 MB): Dynamo asserts so")
    opts = parser.parse_args()
    mp.spawn(worker, args=(opts.nproc, opts.model, opts.steps, opts.bucket_mb, free_port()), nprocs=opts.nproc)
    print(f"DDP with {opts.nproc} processes, torch.compile(backend='tcc'): gradients equal one process's")


if __name__ == "__main__":
    main()
