"""Small models in plain PyTorch compiled with ``torch.compile(model, backend="tcc")``: an MLP, a
CNN and a GPT-2-style decoder (the tests and benchmarks/models.py use them too).

    python examples/torch_compile_models.py     # compiles each, checks inference and a training step
"""

from __future__ import annotations

import copy

import torch
from torch import nn

import tcc.torch  # registers backend="tcc"


class MLP(nn.Module):
    def __init__(self, d_in: int = 7, hidden: int = 33, d_out: int = 5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.net(x), dim=-1)


class CNN(nn.Module):
    """Two convolutions (one strided and dilated, without bias), a batch norm, a gate read
    through a strided slice, a mean over the image and a linear head."""

    def __init__(self, channels: int = 3, width: int = 8, classes: int = 7):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=2, dilation=2, bias=False)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm(self.conv1(x)))
        x = torch.sigmoid(self.conv2(x)) * x[:, :1, ::2, ::2]
        return self.head(x.mean(dim=(2, 3)))


class Block(nn.Module):
    """A GPT-2 block: pre-norm causal self-attention and a GELU (tanh) MLP, with residuals."""

    def __init__(self, d: int, heads: int, context: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """A GPT-2-style decoder: token and position embeddings, ``layers`` blocks, a final norm and
    the output projection tied to the token embedding (GPT-2 small: d=768, heads=12, layers=12)."""

    def __init__(self, vocab: int = 37, d: int = 16, heads: int = 2, layers: int = 1, context: int = 9):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*(Block(d, heads, context) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.ln_f(self.blocks(x)) @ self.tok.weight.t()


def training_step(model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """A loss (0-d) and its gradients: the mean square of the outputs."""
    loss = model(*inputs).square().mean()
    loss.backward()
    return loss


def main() -> None:
    torch.manual_seed(0)
    for model, x in ((MLP(), torch.randn(5, 7)), (CNN(), torch.randn(2, 3, 11, 9)),
                     (GPT(), torch.randint(0, 37, (2, 9)))):
        print(tcc.torch.explain(model, x))
        reference = copy.deepcopy(model)
        compiled = torch.compile(model, backend="tcc", dynamic=False)
        loss, expected = training_step(compiled, x), training_step(reference, x)
        worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
        print(f"{type(model).__name__}: loss {loss.item():.6f} (eager {expected.item():.6f}), "
              f"largest gradient difference {worst:.2e}\n")


if __name__ == "__main__":
    main()
