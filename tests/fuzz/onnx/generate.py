"""``generate(seed)``: a random valid ONNX graph of the operators tcc.onnx claims, and its inputs.

A graph starts from one to three inputs (rank 0 to 4, odd dims and 1s, float mostly, sometimes
f16/f64/int/bool), then appends two to nine nodes, each from a generator of ``OPERATORS`` drawn by
weight. Generators read the newest value half the time, so views chain into views and into
windows; binary ops read one value twice a quarter of the time. One to three of the computed
values are the graph's outputs. The same seed gives the same graph and the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto

from fuzz.onnx import compute, extras, indexing, layout, maths, views, windows
from fuzz.onnx.graph import ELEM, Graph, Val, random_values

# the generators, by weight: views and windows (where the importer's index expressions compose)
# more than their share of the operator list
OPERATORS: list[tuple[float, Callable[[Graph], bool]]] = [
    (3, views.reshape), (2, views.transpose), (1, views.flatten), (1.5, views.unsqueeze), (1.5, views.squeeze),
    (3, views.slice_), (2.5, views.gather), (2, views.split), (1.5, views.concat), (0.5, views.identity),
    (0.7, views.shape_of),
    (2, compute.unary), (1, compute.activation), (2.5, compute.binary), (1.5, compute.compare), (1, compute.cast),
    (2, compute.reduce), (1, compute.softmax), (1.5, compute.matmul), (0.7, compute.gemm), (0.7, compute.normalization),
    (2, windows.conv), (0.5, windows.conv_transpose), (2, windows.pool),
    (0.8, compute.arg_extreme), (2, maths.logic), (0.6, maths.special), (0.8, maths.mod), (1, maths.rounding),
    (1.2, maths.variadic), (3, maths.activation),
    (1, layout.expand), (0.8, layout.tile), (1.5, layout.pad), (0.4, layout.range_), (0.6, layout.trilu),
    (1.2, indexing.gather), (0.8, indexing.gather_elements), (0.6, indexing.gather_nd), (1, indexing.cumsum),
    (0.8, extras.trig_and_rounding), (0.8, extras.scatter_elements), (0.8, extras.scatter_nd), (0.6, extras.top_k),
    (0.6, extras.einsum), (0.8, extras.resize), (1, extras.rms_norm), (1, extras.rotary_embedding),
    (1, extras.attention),
]
OPSETS = (17, 18, 20, 23)  # 23: RMSNormalization, RotaryEmbedding, Attention
INPUT_DTYPES = ("f32",) * 6 + ("f16", "f64", "i32", "i64", "i8", "bool")


@dataclass
class Case:
    """One seed's graph and the inputs to run it on."""

    seed: int
    model: ModelProto
    feeds: dict[str, np.ndarray]


def generate(seed: int) -> Case:
    g = Graph(seed, OPSETS[seed % len(OPSETS)])
    for k in range(g.rng.randint(1, 3)):
        g.input("f32" if k == 0 else g.rng.choice(INPUT_DTYPES), g.random_shape(g.rng.choice((0, 1, 1, 2, 3, 3, 4))))
    weights, gens = zip(*OPERATORS)
    steps = g.rng.randint(2, 9)
    while len(g.nodes) < steps:
        g.rng.choices(gens, weights)[0](g)
    outputs = _outputs(g)
    return Case(seed, g.model(outputs), feeds_for(g.model(outputs), seed))


def _outputs(g: Graph) -> list[Val]:
    """The newest computed value and up to two others: several outputs, some also read by later nodes."""
    newest = g.computed[-1]
    others = [v for v in g.computed[:-1] if v.name != newest.name]
    return [newest] + g.rng.sample(others, min(len(others), g.rng.choice((0, 0, 1, 2))))


def feeds_for(model: ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for the graph's inputs (never zero), from ``seed``: the shrinker's smaller
    graphs of the same inputs read the same data."""
    rng = np.random.default_rng(seed)
    dtypes = {elem: dtype for dtype, elem in ELEM.items()}
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        n = indexing.index_range(vi.name)
        feeds[vi.name] = random_values(rng, dtypes[t.elem_type], shape) if n is None else \
            rng.integers(-n, n, shape).astype(np.int64)
    return feeds
