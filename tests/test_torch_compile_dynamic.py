"""torch.compile(backend="tcc") of graphs with symbolic shapes: shape-generic tcc kernels.

With ``dynamic=True`` Dynamo captures one graph over its shape symbols; the backend traces it per
size and serves every subgraph by kernels compiled once with those symbols dynamic (after probing
a few sizes on the first call), so later sizes build no tcc kernel (``tcc.kernels_built()``).
By default Dynamo captures the first size statically and the second with symbols (its automatic
dynamic shapes): the third size builds nothing. Each result matches eager PyTorch.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import tcc  # noqa: E402
import tcc.torch  # noqa: E402, F401  (registers backend="tcc")


class Block(torch.nn.Module):
    """A GPT-style block: token and position embeddings, causal self-attention (the mask sized
    by the sequence), a GELU MLP, layer norms."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 2, positions: int = 64):
        super().__init__()
        self.heads = heads
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(positions, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(s))
        q, k, v = self.qkv(self.norm1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 7))


def _run(model, compiled, inputs, grad: bool = False):
    with torch.set_grad_enabled(grad):
        want = model(inputs)
        got = compiled(inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_mlp_dynamic_true_builds_its_kernels_once(fresh_cache):
    model = _mlp().eval()
    compiled = torch.compile(model, backend="tcc", dynamic=True)
    _run(model, compiled, torch.randn(3, 16))
    built = tcc.kernels_built()
    for n in (7, 33, 1000, 2):
        _run(model, compiled, torch.randn(n, 16))
    assert tcc.kernels_built() == built


def test_mlp_default_policy_builds_nothing_after_the_second_size(fresh_cache):
    """Dynamo's automatic dynamic shapes: the first size is a static graph (its own kernels),
    the second a graph over a symbol (the shape-generic kernels), later sizes nothing."""
    model = _mlp().eval()
    compiled = torch.compile(model, backend="tcc")
    _run(model, compiled, torch.randn(3, 16))
    first = tcc.kernels_built()
    _run(model, compiled, torch.randn(5, 16))
    built = tcc.kernels_built()
    assert built > first
    for n in (9, 33, 2):
        _run(model, compiled, torch.randn(n, 16))
    assert tcc.kernels_built() == built


def test_gpt_block_dynamic_true_at_three_sequence_lengths(fresh_cache, rng):
    model = Block().eval()
    compiled = torch.compile(model, backend="tcc", dynamic=True)
    _run(model, compiled, torch.randint(0, 50, (2, 7)))
    built = tcc.kernels_built()
    for b, s in ((2, 13), (3, 5), (2, 30)):
        _run(model, compiled, torch.randint(0, 50, (b, s)))
    assert tcc.kernels_built() == built


def test_training_step_with_symbolic_shapes(fresh_cache):
    """Forward and backward graphs over a symbol: gradients match eager at each size, and the
    sizes after the first two build no kernel (the backward's first size is fitted on calls)."""
    model = _mlp()
    compiled = torch.compile(model, backend="tcc", dynamic=True)
    counts = []
    for n in (3, 7, 33, 12):
        x = torch.randn(n, 16)
        model.zero_grad()
        model(x).square().sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        compiled(x).square().sum().backward()
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)
        counts.append(tcc.kernels_built())
    assert counts[-1] == counts[-2]
