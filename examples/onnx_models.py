"""Two PyTorch models exported to ONNX and run through tcc.onnx: a ResNet-18-style CNN and a
transformer encoder block, with random weights (the tests and benchmarks/onnx_networks.py use them too).

    python examples/onnx_models.py          # exports both, compiles them with tcc, checks against PyTorch
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-18 (``blocks=(2, 2, 2, 2)``, ``width=64``) or a smaller one of the same shape."""

    def __init__(self, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for stage, count in enumerate(blocks):
            cout = width * 2 ** stage
            for b in range(count):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class EncoderBlock(nn.Module):
    """A post-norm transformer encoder layer (attention, GELU MLP), written out op by op: the
    legacy ONNX exporter of torch 2.13 cannot export ``nn.MultiheadAttention``."""

    def __init__(self, dim: int = 256, heads: int = 4, hidden: int = 1024):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        head = self.proj.in_features // self.heads
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, head).permute(2, 0, 3, 1, 4).unbind(0)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head), dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights and BatchNorm statistics (a fresh model's are 0/1), in inference mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(max(1, p[0].numel()))))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.5, 0.5, generator=gen)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
    return model.eval()


def export(model: nn.Module, x: torch.Tensor) -> bytes:
    """The model as ONNX bytes (TorchScript exporter: works offline, no onnxscript needed)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice, on purpose
        torch.onnx.export(model, (x,), buffer, dynamo=False, input_names=["x"], output_names=["y"],
                          opset_version=17)
    return buffer.getvalue()


if __name__ == "__main__":
    import tcc

    for name, model, x in (("resnet18", ResNet(), torch.randn(1, 3, 224, 224)),
                           ("encoder", EncoderBlock(), torch.randn(1, 128, 256))):
        model = randomized(model)
        compiled = tcc.onnx.load(export(model, x))
        with torch.no_grad():
            expected = model(x).numpy()
        got = compiled(x.numpy())
        print(f"{name}: max |tcc - torch| = {np.abs(got - expected).max():.3g}")
