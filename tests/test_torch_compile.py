"""``torch.compile(model, backend="tcc")``: small models written in plain PyTorch (an MLP, a CNN, a
GPT-2-style block) infer and train as eager PyTorch does, on fresh random inputs at odd sizes;
operators tcc does not take run in PyTorch with the model still right, and ``explain`` says which.
"""

import copy
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch_paths import eager_path  # noqa: E402, F401  (the fixture "path")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from torch_compile_models import CNN, GPT, MLP  # noqa: E402

import tcc.torch  # noqa: E402  (registers backend="tcc")
from tcc.interop import torch_compile  # noqa: E402


def compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend="tcc", dynamic=False)


def check_inference(model, *inputs, atol=1e-5):
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
        got = compiled(model)(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=atol)


def check_training(model, *inputs, atol=1e-5):
    """One step: the loss (a 0-d result) and every parameter's gradient as eager's."""
    reference = copy.deepcopy(model)
    loss = compiled(model)(*inputs).square().mean()
    loss.backward()
    expected = reference(*inputs).square().mean()
    expected.backward()
    assert loss.shape == ()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=atol)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    for (name, b), c in zip(model.named_buffers(), reference.buffers()):  # batch norm's running statistics
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("batch", [1, 6])
def test_mlp_infers_as_eager(batch):
    torch.manual_seed(batch)
    check_inference(MLP(), torch.randn(batch, 7))


def test_mlp_trains_as_eager():
    torch.manual_seed(1)
    check_training(MLP(), torch.randn(5, 7))


def test_cnn_infers_and_trains_as_eager():
    """Batch norm with batch statistics (and its running ones updated), the gradients of the
    convolutions as convolutions in tcc."""
    torch.manual_seed(2)
    model = CNN()
    x = torch.randn(2, 3, 11, 9)
    check_inference(model, x)
    with torch_compile.recording() as record:
        check_training(model.train(), x)
    assert record.tcc["convolution_backward.default"] == 2
    assert record.tcc["_native_batch_norm_legit_functional.default"] == 1


def test_resnet_infers_as_eager():
    """A ResNet (batch norm folded at inference, max pooling, strided and 1x1 convolutions)."""
    onnx_models = pytest.importorskip("onnx_models")
    model = onnx_models.randomized(onnx_models.ResNet(width=8, blocks=(1, 1), classes=11))
    report = tcc.torch.explain(model.eval(), torch.randn(1, 3, 33, 35))
    assert not report.eager
    check_inference(model, torch.randn(2, 3, 33, 35), atol=1e-4)


def test_gpt_block_infers_and_trains_as_eager():
    """Every call in tcc, the embeddings' gradient (a scatter-add) included."""
    torch.manual_seed(3)
    ids = torch.randint(0, 37, (2, 7))
    check_inference(GPT(), ids)
    with torch_compile.recording() as record:
        check_training(GPT().train(), ids, atol=2e-5)
    assert not record.eager and record.tcc["index_put.default"] == 2  # the token and position embeddings


def test_backward_runs_in_tcc():
    """The backward graph reaches the engine too: its matrix products and sums are tcc's."""
    torch.manual_seed(4)
    with torch_compile.recording() as record:
        check_training(MLP(), torch.randn(3, 7))
    assert record.graphs == 2  # forward and backward
    assert record.tcc["mm.default"] >= 4 and record.tcc["sum.dim_IntList"] >= 2
    assert not record.eager


class Unsupported(nn.Module):
    """A cumulative maximum (no tcc lowering) between two layers tcc takes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(7, 9), nn.Linear(9, 3)

    def forward(self, x):
        return self.b(torch.cummax(torch.tanh(self.a(x)), dim=1).values)


def test_unsupported_operator_falls_back_listed_once():
    torch.manual_seed(5)
    model, x = Unsupported(), torch.randn(4, 7)
    torch_compile._WARNED.discard("cummax.default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_inference(model, x)
        check_training(model, x)
    said = [w for w in caught if "cummax" in str(w.message)]
    assert len(said) == 1 and "runs in PyTorch" in str(said[0].message)
    report = tcc.torch.explain(model, x)
    assert report.eager == {"cummax.default": 1}
    assert report.tcc["addmm.default"] == 2 and report.partitions == 2
    assert "cummax.default" in str(report) and "in tcc" in str(report)


def test_a_program_tcc_fails_to_compile_runs_in_pytorch(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise tcc.TccError("internal error: a pass gave up")

    monkeypatch.setattr(torch_compile.GraphModel, "compile", refuse)
    torch.manual_seed(14)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_inference(MLP(), torch.randn(3, 7))
        check_training(MLP(), torch.randn(3, 7))
    assert sum("runs in PyTorch: error: internal error: a pass gave up" in str(w.message) for w in caught) == 3


def test_explain_lists_every_operator_in_tcc():
    torch.manual_seed(6)
    report = tcc.torch.explain(GPT(), torch.randint(0, 37, (1, 9)))
    assert not report.eager and report.partitions == 1
    assert {"embedding.default", "native_layer_norm.default", "_softmax.default", "bmm.default"} <= set(report.tcc)


def test_backend_by_object_and_by_name():
    assert tcc.torch.backend is torch_compile.backend
    assert "tcc" in torch._dynamo.list_backends(exclude_tags=())
    torch.manual_seed(7)
    model, x = MLP(), torch.randn(3, 7)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=tcc.torch.backend)(x), model(x), rtol=1e-4, atol=1e-5)


def test_new_shape_recompiles():
    torch.manual_seed(8)
    model = MLP().eval()
    c = compiled(model)
    with torch.no_grad():
        for batch in (1, 7, 2):
            x = torch.randn(batch, 7)
            torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)


def test_symbolic_shapes_compile_for_each_call():
    """Dynamo's automatic dynamic shapes (a graph with symbolic sizes after the second shape):
    each call's shapes are traced again and run in tcc (shape-generic kernels:
    tests/test_torch_compile_dynamic.py counts them), forward and backward."""
    torch.manual_seed(12)
    model = MLP()
    torch._dynamo.reset()
    c = torch.compile(model, backend="tcc")
    with torch_compile.recording() as record:
        for batch in (2, 5, 1, 5):
            x = torch.randn(batch, 7)
            with torch.no_grad():
                torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)
            reference = copy.deepcopy(model)
            c(x).square().mean().backward()
            reference(x).square().mean().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            model.zero_grad()
    assert not record.eager and record.graphs >= 3 * 3  # per shape: inference, forward, backward


def test_programs_compile_for_cuda_without_a_gpu(monkeypatch):
    """The GPT's forward and backward programs (built here on the CPU) go through the CUDA
    pipeline to PTX through NVRTC, as they would for CUDA tensors."""
    pytest.importorskip("cuda.bindings")
    sources = []
    build = torch_compile._Program._build

    def keep(self, args):
        build(self, args)
        sources.append(self.model.source)

    monkeypatch.setattr(torch_compile._Program, "_build", keep)
    torch.manual_seed(13)
    check_training(GPT(d=8, heads=2, context=5), torch.randint(0, 37, (1, 5)))
    assert len(sources) == 2  # forward and backward
    for source in sources:
        op = next(iter(tcc.compile(source, target="cuda", arch="sm_80")))
        assert ".entry" in op.stage_text({}, "ptx")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_infer_and_train_as_eager():
    torch.manual_seed(9)
    ids = torch.randint(0, 37, (2, 7), device="cuda")
    check_inference(GPT().cuda(), ids, atol=1e-4)
    check_training(MLP().cuda(), torch.randn(5, 7, device="cuda"), atol=1e-4)


SUM_OF_SQUARES = """
op sq(X: f32[N]) -> L: f32[] {
    L[] = sum[i](X[i] * X[i])
}
"""


@pytest.mark.parametrize("backend", [None, "eager", "aot_eager", "tcc"])
def test_zero_d_result_of_a_tcc_torch_op(path, backend):
    """A tcc.torch op with a 0-d result (a scalar loss): repeat eager calls with and without a
    graph (the second call takes the eager path's learnt signature) and under torch.compile."""
    op = tcc.torch.op(tcc.compile(SUM_OF_SQUARES).sq, namespace=f"zero_d_{path}_{backend}")
    torch.manual_seed(10)
    fn = (lambda x: op(x) * 2.0) if backend is None else torch.compile(lambda x: op(x) * 2.0, backend=backend)
    torch._dynamo.reset()
    for n in (7, 7, 1, 33, 33):
        x = torch.randn(n, requires_grad=True)
        y = fn(x)
        assert y.shape == ()
        torch.testing.assert_close(y, 2.0 * (x * x).sum())
        y.backward()
        torch.testing.assert_close(x.grad, 4.0 * x.detach())
        with torch.no_grad():
            torch.testing.assert_close(fn(x), 2.0 * (x * x).sum())


def test_inference_weights_follow_parameter_updates():
    """In inference the parameters are the programs' constant weights (a uniform one a literal):
    an in-place update, an optimizer step or a loaded state compiles them again from the values."""
    torch.manual_seed(11)
    model, ids = GPT().eval(), torch.randint(0, 37, (2, 9))
    c = compiled(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for change in (None, "scale", "step", "state"):
        with torch.no_grad():
            if change == "scale":
                model.blocks[0].ln1.weight.mul_(1.5)  # all ones before: a literal in the source
            elif change == "state":
                model.load_state_dict(GPT().state_dict())
        if change == "step":
            model(ids).square().mean().backward()
            optimizer.step()
        with torch.no_grad():
            torch.testing.assert_close(c(ids), model(ids), rtol=1e-4, atol=1e-5)
