"""Part 3 of benchmarks/dynamic.py: whole models at 20 sequence lengths, through both front doors.

For each way of compiling, from an empty disk and memory cache: the kernels built over the 20
lengths (``tcc.kernels_built()``) and the seconds from the first load or call to the end of the
last call; the ratio is the specialised path's seconds over this one's. Then the generic ONNX
model's call time against the specialised model's at a few lengths (interleaved medians).
"""

from __future__ import annotations

import io
import math
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import onnx
import torch
import transformers as hf

import tcc
import tcc.torch  # noqa: F401  (backend="tcc")
from tcc.runtime import cache

BATCH, VOCAB, POSITIONS = 2, 101, 128
LENGTHS = [int(n) for n in np.random.default_rng(2).choice(np.arange(2, POSITIONS), size=20, replace=False)]


class FirstOutput(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args, return_dict=False)[0]


class Block(torch.nn.Module):
    """A GPT block: embeddings, causal attention (its mask sized by the sequence), a GELU MLP."""

    def __init__(self, dim: int = 64, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = torch.nn.Embedding(VOCAB, dim), torch.nn.Embedding(POSITIONS, dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(s))
        q, k, v = self.qkv(self.norm1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        attn = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def gpt2_onnx() -> onnx.ModelProto:
    config = hf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=POSITIONS,
                           bos_token_id=0, eos_token_id=0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(FirstOutput(hf.GPT2Model(config).eval()), (torch.randint(0, VOCAB, (BATCH, 7)),), buffer,
                          dynamo=False, input_names=["input_ids"], output_names=["out"], opset_version=17,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "out": {0: "batch", 1: "seq"}})
    return onnx.load_from_string(buffer.getvalue())


def _ids(seq: int) -> np.ndarray:
    return np.random.default_rng(seq).integers(0, VOCAB, (BATCH, seq))


def counted(run, root: str) -> tuple[int, float]:
    """(kernels built, seconds) of ``run()`` from an empty disk cache (a new directory under
    ``root``) and memory cache."""
    os.environ["TCC_CACHE_DIR"] = tempfile.mkdtemp(dir=root)
    cache.MEMORY.clear()
    built, start = tcc.kernels_built(), time.perf_counter()
    run()
    return tcc.kernels_built() - built, time.perf_counter() - start


def row(label: str, built: int, seconds: float, anchor: float) -> None:
    print(f"20 lengths, {label:38s}: {built:4d} kernels built, {seconds:7.1f} s "
          f"(specialised / this: {anchor / seconds:5.2f}x)")


def onnx_rows(root: str) -> tuple[object, object]:
    model = gpt2_onnx()
    specialised: dict[int, object] = {}
    generic: list = []

    def each_length() -> None:
        for n in LENGTHS:
            specialised[n] = tcc.onnx.load(model, input_shapes={"input_ids": (BATCH, n)}, progress=False, jobs=1)
            specialised[n](_ids(n))

    def one_model() -> None:
        generic.append(tcc.onnx.load(model, progress=False))
        for n in LENGTHS:
            generic[0](_ids(n))

    built, anchor = counted(each_length, root)
    row("tcc.onnx, input_shapes= per length", built, anchor, anchor)
    row("tcc.onnx, symbolic batch and seq", *counted(one_model, root), anchor)
    return generic[0], specialised


def torch_rows(root: str) -> None:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    torch._dynamo.config.recompile_limit = max(getattr(torch._dynamo.config, "recompile_limit", 0), 64)
    block = Block().eval()

    def calls(dynamic: bool | None):
        def run() -> None:
            torch._dynamo.reset()
            compiled = torch.compile(block, backend="tcc", dynamic=dynamic)
            with torch.no_grad():
                for n in LENGTHS:
                    compiled(torch.from_numpy(_ids(n)))
        return run

    built, anchor = counted(calls(False), root)
    row("torch.compile, dynamic=False", built, anchor, anchor)
    row("torch.compile, default (automatic dynamic)", *counted(calls(None), root), anchor)
    row("torch.compile, dynamic=True", *counted(calls(True), root), anchor)
    torch._dynamo.reset()


def call_times(generic, specialised, rounds: int) -> None:
    for n in LENGTHS[:3]:
        ids = _ids(n)
        np.testing.assert_allclose(generic(ids), specialised[n](ids), rtol=1e-4, atol=1e-4)
        ratios = []
        for _ in range(rounds):
            t_static = _time(specialised[n], ids)
            t_generic = _time(generic, ids)
            ratios.append(t_static / t_generic)
        print(f"gpt2 onnx seq={n:<4d} generic/specialised throughput {statistics.median(ratios):5.2f}x "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


def _time(fn, ids, calls: int = 5) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn(ids)
    return (time.thread_time() - start) / calls


def models(rounds: int) -> None:
    print(f"lengths: {sorted(LENGTHS)}, batch {BATCH}")
    with tempfile.TemporaryDirectory() as root:
        generic, specialised = onnx_rows(root)
        call_times(generic, specialised, rounds)
        torch_rows(root)
