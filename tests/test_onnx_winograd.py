"""3x3 convolutions by Winograd's F(2x2, 3x3) in tcc.onnx on the CPU: where it applies, that it
matches onnxruntime and PyTorch at odd sizes, and where the direct convolution stays."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

import tcc  # noqa: E402
from tcc.interop import onnx_winograd  # noqa: E402
from tcc.interop.onnx import translate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import onnx_models  # noqa: E402


class Block(torch.nn.Module):
    """conv3x3 + relu, conv3x3 + the block's input (or a 1x1 stride-2 downsample of it) + relu."""

    def __init__(self, c: int, f: int, stride: int = 1):
        super().__init__()
        self.a = torch.nn.Conv2d(c, f, 3, stride, 1)
        self.b = torch.nn.Conv2d(f, f, 3, 1, 1)
        self.down = torch.nn.Conv2d(c, f, 1, stride) if stride != 1 or c != f else None

    def forward(self, x):
        y = torch.relu(self.a(x))
        return torch.relu(self.b(y) + (x if self.down is None else self.down(x)))


def _winograd_notes(data: bytes) -> list[str]:
    return [n for n in translate(onnx.load_from_string(data), winograd=True).notes if "Winograd" in n]


@pytest.mark.parametrize("n, c, f, h, w, stride", [(1, 16, 16, 8, 8, 1), (2, 17, 33, 9, 13, 1),
                                                   (1, 32, 16, 15, 8, 1), (3, 16, 19, 20, 17, 2)])
def test_winograd_blocks_match_ort_and_torch(n, c, f, h, w, stride, rng):
    model = onnx_models.randomized(Block(c, f, stride)).eval()
    x = torch.from_numpy(rng.standard_normal([n, c, h, w]).astype(np.float32))
    data = onnx_models.export(model, x)
    notes = _winograd_notes(data)
    # the stride-2 block's first conv stays direct; every stride-1 3x3 conv here is Winograd's
    assert len(notes) == (1 if stride == 2 else 2), notes
    got = tcc.onnx.load(data)(x.numpy())
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n, c, f, h, w", [(1, 8, 16, 16, 16), (1, 16, 8, 16, 16), (1, 16, 16, 7, 9),
                                           (1, 128, 64, 56, 56), (8, 128, 128, 56, 56)])
def test_direct_where_winograd_does_not_pay(n, c, f, h, w, rng):
    """Few channels, a side under 8 pixels (7x7 layers: tiles padded to 8x8) or an image's
    transformed input over ``MAX_TILES_BYTES`` (128 channels at 56x56: 6.4 MiB) keep the direct
    convolution, at any batch."""
    model = onnx_models.randomized(torch.nn.Conv2d(c, f, 3, 1, 1)).eval()
    x = torch.from_numpy(rng.standard_normal([n, c, h, w]).astype(np.float32))
    assert _winograd_notes(onnx_models.export(model, x)) == []


@pytest.mark.parametrize("n, c, side", [(8, 128, 28), (2, 64, 56)])
def test_the_budget_is_per_image(n, c, side, rng):
    """128 channels at 28x28 (1.6 MiB of transformed input an image) and 64 at 56x56 (3 MiB) take
    Winograd's at a batch of several images too, and match onnxruntime there."""
    model = onnx_models.randomized(torch.nn.Conv2d(c, c, 3, 1, 1)).eval()
    x = torch.from_numpy(rng.standard_normal([n, c, side, side]).astype(np.float32))
    data = onnx_models.export(model, x)
    assert len(_winograd_notes(data)) == 1
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(tcc.onnx.load(data)(x.numpy()), expected, rtol=1e-4, atol=1e-4)


def test_cuda_keeps_the_direct_convolution(rng):
    """The importer uses Winograd only for the CPU (``load(..., target="cuda")`` translates without it)."""
    model = onnx_models.randomized(Block(16, 16)).eval()
    data = onnx_models.export(model, torch.from_numpy(rng.standard_normal([1, 16, 8, 8]).astype(np.float32)))
    cuda = tcc.onnx.load(data, target="cuda", compile_now=False)
    cpu = tcc.onnx.load(data, compile_now=False)
    assert not any("Winograd" in n for n in cuda.program.notes)
    assert any("Winograd" in n for n in cpu.program.notes)


def test_weight_transform_is_lavins():
    """U = G g G^T with the F(2x2, 3x3) matrices: A^T [U * (B^T d B)] A of a 4x4 tile is the
    3x3 correlation's 2x2 outputs (in float64, to rounding)."""
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    u = onnx_winograd.G @ g @ onnx_winograd.G.T
    y = onnx_winograd.A_T @ (u * (onnx_winograd.B_T @ d @ onnx_winograd.B_T.T)) @ onnx_winograd.A_T.T
    direct = np.array([[np.sum(d[a:a + 3, b:b + 3] * g) for b in range(2)] for a in range(2)])
    np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)


def test_input_transform_forks_once(rng):
    """The input transform's group (rows, then tiles from them, per image and row of B^T) runs as
    one parallel loop with the rows buffer private to each iteration: forking per statement and
    row of B^T cost a thread wake-up each (73 forks a ResNet-18 call, 39 now)."""
    model = onnx_models.randomized(Block(32, 32)).eval()
    x = torch.from_numpy(rng.standard_normal([1, 32, 16, 16]).astype(np.float32))
    data = onnx_models.export(model, x)
    compiled = tcc.onnx.load(data, compile_now=False)
    kernels = compiled.lower("scheduled").split("# kernel ")[1:]
    transforms = [k for k in kernels if "x1: f32[4, 4]," in k and "f32[2, 4]" not in k]  # B^T, not A^T
    assert len(transforms) == 1, kernels
    loops = [line.strip() for line in transforms[0].splitlines() if line.strip().startswith("for ")]
    assert loops[0].endswith("# parallel") and transforms[0].count("# parallel") == 1, transforms[0]
    np.testing.assert_allclose(compiled.compile()(x.numpy()), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)
