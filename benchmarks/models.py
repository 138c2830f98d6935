"""Whole PyTorch models through ``torch.compile(backend="tcc")`` against eager PyTorch and Inductor.

    python benchmarks/models.py [--models mlp cnn gpt resnet] [--batches 1 8] [--repeat 20] [--no-inductor]
    python benchmarks/models.py --cuda [--models ...]          # the same on CUDA tensors (on the device)

For each model and batch: the cold compile seconds of each backend (tcc: an empty cache directory;
Inductor: its own caches as they are), the largest difference from eager, then inference (no
grad) and one training step (forward, a mean-square loss, backward) timed side by side,
interleaved, as medians with quartiles, with ratios to eager PyTorch. Models are in
examples/torch_compile_models.py and examples/onnx_models.py (random weights); ``gpt`` is a small
GPT-2-style config (``--gpt-small``: GPT-2 small's, d=768, 12 heads, 12 layers, context 128).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tcc.codegen_cpu.pool import SPIN_COUNT  # before torch: see benchmarks/onnx_networks.py

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import onnx_models  # noqa: E402
import torch_compile_models as models  # noqa: E402

import tcc.torch  # noqa: E402, F401  (registers backend="tcc")
from tcc.runtime import cache  # noqa: E402

GPT_SMALL = {"vocab": 50257, "d": 768, "heads": 12, "layers": 12, "context": 128}


def make(name: str, batch: int, gpt_small: bool, device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        model, x = models.MLP(256, 1024, 256), torch.randn(batch, 256)
    elif name == "cnn":
        model, x = models.CNN(3, 32, 10), torch.randn(batch, 3, 64, 64)
    elif name == "gpt":
        config = GPT_SMALL if gpt_small else {"vocab": 1024, "d": 128, "heads": 4, "layers": 2, "context": 64}
        model, x = models.GPT(**config), torch.randint(0, config["vocab"], (batch, config["context"]))
    else:
        model, x = onnx_models.randomized(onnx_models.ResNet(width=16, blocks=(1, 1, 1, 1))), \
            torch.randn(batch, 3, 64, 64)
    return model.to(device), x.to(device)


def interleaved(runs: dict[str, Callable], repeat: int, sync: Callable) -> dict[str, tuple[float, float, float]]:
    """(median, first quartile, third quartile) seconds of each callable, calls interleaved."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), *np.percentile(t, [25, 75])) for name, t in times.items()}


def report(what: str, medians: dict[str, tuple[float, float, float]]) -> None:
    base = medians["eager"][0]
    print(f"  {what}:")
    for run, (seconds, q1, q3) in medians.items():
        print(f"    {run:9s} {seconds * 1e3:9.3f} ms  {seconds / base:5.2f}x eager  (quartiles {q1 * 1e3:.3f}-"
              f"{q3 * 1e3:.3f})")


def train_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
    return step


def compiled(model: torch.nn.Module, backend: str, x: torch.Tensor, train: bool, sync: Callable) -> tuple[Any, float]:
    """The compiled model and its cold compile seconds (the first call, forward and backward)."""
    start = time.perf_counter()
    c = torch.compile(model, backend=backend, dynamic=False)
    if train:
        train_step(c, x)()
    else:
        with torch.no_grad():
            c(x)
    sync()
    return c, time.perf_counter() - start


def bench(name: str, batch: int, args: argparse.Namespace) -> None:
    device = "cuda" if args.cuda else "cpu"
    sync = torch.cuda.synchronize if args.cuda else (lambda: None)
    backends = ["tcc"] + ([] if args.no_inductor else ["inductor"])
    model, x = make(name, batch, args.gpt_small, device)
    print(f"{name} batch {batch} ({device}), load average {os.getloadavg()[0]:.1f}")
    for train in (False, True):
        eager = copy.deepcopy(model).train(train)
        runs: dict[str, Callable] = {"eager": train_step(eager, x) if train else (lambda e=eager: e(x))}
        colds = []
        torch._dynamo.reset()  # once per section: a reset between backends would recompile the first in the timed loop
        for backend in backends:
            with tempfile.TemporaryDirectory() as cache_dir:  # tcc cold: nothing cached
                os.environ["TCC_CACHE_DIR"] = cache_dir
                cache.MEMORY.clear()
                c, cold = compiled(copy.deepcopy(model).train(train), backend, x, train, sync)
            runs[backend] = train_step(c, x) if train else (lambda c=c: c(x))
            colds.append(f"{backend} {cold:.1f} s")
            if not train:
                with torch.no_grad():
                    colds[-1] += f" (max |diff| {(c(x) - eager(x)).abs().max().item():.1e})"
        print(f"  {'training step' if train else 'inference'}: cold compile {', '.join(colds)}")
        with torch.set_grad_enabled(train):
            for fn in runs.values():  # warm-up
                fn()
            report("training step" if train else "inference", interleaved(runs, args.repeat, sync))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "gpt", "resnet"],
                        choices=["mlp", "cnn", "gpt", "resnet"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--gpt-small", action="store_true", help="GPT-2 small's config for gpt")
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the operators left to PyTorch are listed by tcc.torch.explain
    torch._dynamo.config.cache_size_limit = 64  # each section compiles new copies of one model class
    if args.threads:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads: torch {torch.get_num_threads()}, tcc {len(os.sched_getaffinity(0))}"
          + (f", device {torch.cuda.get_device_name()}" if args.cuda else ""))
    for name in args.models:
        for batch in args.batches:
            bench(name, batch, args)


if __name__ == "__main__":
    main()
