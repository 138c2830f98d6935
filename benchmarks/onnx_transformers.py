"""Hugging Face transformers through ONNX: tcc.onnx against onnxruntime on the CPU.

    python benchmarks/onnx_transformers.py [--models bert gpt2 vit llama t5] [--exporters torchscript dynamo]
                                           [--hidden 128] [--seq 64] [--layers 2] [--batch 1]
                                           [--repeat 30] [--threads 2]

Random-weight BERT, GPT-2, ViT, a Llama-style decoder (grouped-query attention, rotary
embeddings, RMSNorm) and T5's encoder (2 layers each unless told; BERT-base and GPT-2-small are
``--hidden 768 --layers 12 --seq 128``), exported by torch.onnx's TorchScript
exporter (opset 17) and its dynamo exporter (opset 18, where onnxscript is installed), imported
with tcc.onnx.load as exported. Per model and exporter: whether it imports, the largest
difference from onnxruntime, the compile time, and run times measured side by side, interleaved,
as medians with quartiles, as ratios to onnxruntime (its threads not spinning between runs).
Needs ``transformers``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
import warnings

from tcc.codegen_cpu.pool import SPIN_COUNT  # before torch: its libgomp threads spin as briefly as tcc's

if "OMP_WAIT_POLICY" not in os.environ:  # torch's OpenMP threads spin ~3 ms after each call otherwise
    os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers as hf  # noqa: E402

import tcc  # noqa: E402


class FirstOutput(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args, return_dict=False)[0]


def build(name: str, hidden: int, seq: int, layers: int = 2, batch: int = 1):
    """The model, its example inputs and their names (heads of 64 from hidden 768 up, as in
    BERT-base and GPT-2-small; of 32 below)."""
    heads, vocab, ff = max(hidden // (64 if hidden >= 768 else 32), 2), 1000, 4 * hidden
    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if name == "bert":
        config = hf.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                               num_attention_heads=heads, intermediate_size=ff, max_position_embeddings=max(seq, 64))
        return hf.BertModel(config), (ids, mask), ["input_ids", "attention_mask"]
    if name == "gpt2":
        config = hf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max(seq, 64),
                               bos_token_id=0, eos_token_id=0)
        return hf.GPT2Model(config), (ids,), ["input_ids"]
    if name == "vit":
        config = hf.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                              intermediate_size=ff, image_size=64, patch_size=8)
        return hf.ViTModel(config), (torch.randn(batch, 3, 64, 64),), ["pixel_values"]
    if name == "llama":
        config = hf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                                num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                                max_position_embeddings=max(seq, 64), attn_implementation="eager")
        return hf.LlamaModel(config), (ids,), ["input_ids"]
    config = hf.T5Config(vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=ff, num_layers=layers,
                         num_heads=heads)
    return hf.T5EncoderModel(config), (ids, mask), ["input_ids", "attention_mask"]


def export(model: torch.nn.Module, args: tuple, names: list[str], exporter: str) -> onnx.ModelProto:
    wrapped = FirstOutput(model.eval())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(wrapped, args, dynamo=True, input_names=names, output_names=["out"],
                                     opset_version=18, verbose=False).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(wrapped, args, buffer, dynamo=False, input_names=names, output_names=["out"],
                          opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def interleaved(runs: dict, repeat: int) -> dict[str, tuple[float, float, float]]:
    """(median, first quartile, third quartile) seconds of each callable, calls interleaved."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeat):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), *np.percentile(t, [25, 75])) for name, t in times.items()}


def bench(name: str, exporter: str, a: argparse.Namespace, batch: int) -> None:
    torch.manual_seed(0)
    model, args, names = build(name, a.hidden, a.seq, a.layers, batch)
    try:
        proto = export(model, args, names, exporter)
    except Exception as exc:  # the exporter's own failure, not tcc's
        print(f"{name} ({exporter}): export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    given = dict(zip(names, (a.numpy() for a in args)))
    feeds = {i.name: given[i.name] for i in session.get_inputs()}
    start = time.perf_counter()
    try:
        compiled = tcc.onnx.load(proto, input_shapes={k: v.shape for k, v in feeds.items()}, progress=False)
    except tcc.TccError as exc:
        print(f"{name} ({exporter}): tcc import failed: {exc}")
        return
    seconds = time.perf_counter() - start
    err = float(np.abs(compiled(**feeds) - session.run(None, feeds)[0]).max())
    medians = interleaved({"tcc": lambda: compiled(**feeds), "ort": lambda: session.run(None, feeds)}, a.repeat)
    (t, t1, t3), (o, o1, o3) = medians["tcc"], medians["ort"]
    print(f"{name:6s} {exporter:11s} batch {batch} imports; max |tcc - ort| {err:.1e}; compile {seconds:5.1f} s; "
          f"tcc {t * 1e3:7.2f} ms ({t1 * 1e3:.2f}-{t3 * 1e3:.2f}), "
          f"ort {o * 1e3:7.2f} ms ({o1 * 1e3:.2f}-{o3 * 1e3:.2f}), "
          f"tcc/ort {t / o:5.2f}; load {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "vit", "llama", "t5"])
    parser.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    tcc.set_num_threads(a.threads)
    torch.set_num_threads(1)
    for name in a.models:
        for exporter in a.exporters:
            for batch in a.batch:
                bench(name, exporter, a, batch)


if __name__ == "__main__":
    main()
