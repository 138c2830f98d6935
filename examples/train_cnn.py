"""Train a small CNN whose layers are tcc ops inside PyTorch, and check its gradients.

The convolutions, the matmul, bias+relu and the softmax cross-entropy are written in the tcc
language below and become PyTorch operators through ``tcc.torch`` (their backward ops derived
by ``tcc.grad``). On synthetic data (noisy copies of ten random templates) the script

1. checks the gradients of every weight against PyTorch's own layers on the same weights;
2. trains for ``--steps`` SGD steps and checks that the loss falls;
3. with ``--nproc 2``, runs the same model under DistributedDataParallel (gloo on the CPU, NCCL
   on GPUs), each process on half the batch, and checks that the averaged gradients equal the
   gradients of one process on the whole batch.

    python examples/train_cnn.py [--steps 30] [--nproc 2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import tcc

OPS = """
op conv[S = 1, P = 1](X: f32[N, C, H, W], Wt: f32[F, C, KH, KW])
    -> Y: f32[N, F, (H + 2*P - KH) // S + 1, (W + 2*P - KW) // S + 1] {
    Xp = pad(X, [0, 0, P, P])
    Y[n, f, y, x] = sum[c, r, s](Xp[n, c, y*S + r, x*S + s] * Wt[f, c, r, s])
}

op bias_relu(X: f32[N, C, H, W], b: f32[C]) -> Y: f32[N, C, H, W] {
    Y[n, c, y, x] = max(X[n, c, y, x] + b[c], 0.0)
}

op matmul(A: f32[M, K], B: f32[K, N]) -> C: f32[M, N] {
    C[i, j] = sum[k](A[i, k] * B[k, j])
}

# The mean over the batch of -log softmax(Z + b)[label], labels one-hot in T.
op softmax_xent(Z: f32[N, C], b: f32[C], T: f32[N, C]) -> L: f32[1] {
    m[n] = max[c](Z[n, c] + b[c])
    lse[n] = log(sum[c](exp(Z[n, c] + b[c] - m[n]))) + m[n]
    L[z] = sum[n](lse[n] - sum[c](T[n, c] * (Z[n, c] + b[c]))) / N
}
"""
CLASSES, SIZE, BATCH = 10, 12, 32
ops = tcc.torch.library(OPS, namespace="train_cnn")


class TccCNN(torch.nn.Module):
    """conv 3x3 1->8, bias+relu, conv 3x3/2 8->16, bias+relu, linear 576->10: all tcc ops."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def param(*shape: int, fan_in: int = 1) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / fan_in ** 0.5)

        self.w1, self.b1 = param(8, 1, 3, 3, fan_in=9), param(8, fan_in=100)
        self.w2, self.b2 = param(16, 8, 3, 3, fan_in=72), param(16, fan_in=100)
        self.w3, self.b3 = param(16 * 6 * 6, CLASSES, fan_in=576), param(CLASSES, fan_in=100)

    def forward(self, x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        y = ops.bias_relu(ops.conv(x, self.w1), self.b1)
        y = ops.bias_relu(ops.conv(y, self.w2, S=2), self.b2)
        return ops.softmax_xent(ops.matmul(y.flatten(1), self.w3), self.b3, onehot)[0]


def torch_loss(model: TccCNN, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same network in PyTorch's own layers, on the same weights."""
    y = F.relu(F.conv2d(x, model.w1, model.b1, padding=1))
    y = F.relu(F.conv2d(y, model.w2, model.b2, stride=2, padding=1))
    return F.cross_entropy(y.flatten(1) @ model.w3 + model.b3, labels)


def data(batch: int, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Noisy copies of ten fixed random templates: (images, labels, one-hot labels)."""
    templates = torch.randn(CLASSES, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (batch,), generator=g)
    x = templates[labels] + 2.0 * torch.randn(batch, 1, SIZE, SIZE, generator=g)
    return x.to(device), labels.to(device), F.one_hot(labels, CLASSES).float().to(device)


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    return [g.detach().clone() for g in torch.autograd.grad(loss, list(model.parameters()))]


def max_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-6)) for a, b in zip(got, want))


def check_against_torch(device: str) -> float:
    model = TccCNN().to(device)
    x, labels, onehot = data(BATCH, 0, device)
    ours = model(x, onehot)
    theirs = torch_loss(model, x, labels)
    err = max_error(gradients(model, ours), gradients(model, theirs))
    ours, theirs = float(ours.detach()), float(theirs.detach())
    err = max(err, abs(ours - theirs) / abs(theirs))
    print(f"loss {ours:.6f} (PyTorch {theirs:.6f}); gradients vs PyTorch: max relative error {err:.2e}")
    return err


def train(device: str, steps: int) -> tuple[float, float]:
    model = TccCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, _, onehot = data(BATCH, step, device)
        loss = model(x, onehot)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if step % 5 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}", flush=True)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    return first, last


def ddp_worker(rank: int, nproc: int, device: str, steps: int, port: int) -> None:
    """One process of the DDP run: half the batch each, gradients averaged by DDP."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
    else:
        dev = "cpu"
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=nproc)
    try:
        model = TccCNN().to(dev)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(steps):
            x, _, onehot = data(BATCH, step, dev)
            share = BATCH // nproc
            mine = slice(rank * share, (rank + 1) * share)
            reference = TccCNN().to(dev)
            reference.load_state_dict(model.state_dict())
            whole = gradients(reference, reference(x[:share * nproc], onehot[:share * nproc]))
            opt.zero_grad()
            ddp(x[mine], onehot[mine]).backward()
            err = max_error([p.grad for p in model.parameters()], whole)
            if rank == 0:
                print(f"DDP step {step}: gradients vs one process on the whole batch: max relative error "
                      f"{err:.2e}", flush=True)
            if err > 1e-4:
                raise SystemExit(f"rank {rank}: DDP gradients differ from one process's ({err:.2e})")
            opt.step()
        dist.barrier()  # no rank tears gloo down while the other still talks to it (it aborted 1 run in 8)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=1, help="processes under DDP (2: gloo on CPU, NCCL on GPUs)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    opts = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False  # PyTorch's GPU reference in full f32, like tcc
    torch.backends.cuda.matmul.allow_tf32 = False
    if opts.nproc > 1:
        mp.spawn(ddp_worker, args=(opts.nproc, opts.device, opts.steps, free_port()), nprocs=opts.nproc)
        print(f"DDP with {opts.nproc} processes: gradients equal one process's")
        return
    err = check_against_torch(opts.device)
    first, last = train(opts.device, opts.steps)
    print(f"loss {first:.4f} -> {last:.4f} over {opts.steps} steps")
    if err > 1e-4 or not last < 0.5 * first:
        sys.exit("FAILED: " + ("gradients differ from PyTorch's" if err > 1e-4 else "the loss did not fall"))


if __name__ == "__main__":
    main()
