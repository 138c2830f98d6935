"""The CUDA backend without a GPU: every example goes through scheduling, CUDA C and NVRTC to
cubin; compile errors, bad artifacts and bad calls are clean TccErrors. (Runs in CI.)"""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import gpu_sim
import numpy as np
import pytest
from helpers import child_pythonpath
from test_examples import CASES

import tcc
from tcc.codegen_cuda import cuda_c, driver, nvrtc
from tcc.errors import TccArgumentError, TccCompileError, TccError, TccRuntimeError
from tcc.ir.loops import For, Seq
from tcc.runtime import cuda as rt
from tcc.target import CudaTarget
from tcc.testing import specialize_inputs

pytest.importorskip("cuda.bindings.nvrtc")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _fake_args(op, case):
    """Zero host arrays of the right shapes: enough to pick a specialisation."""
    bindings = {**op.te.cparams, **case}
    shapes = specialize_inputs(op.te, bindings)
    args = []
    for name in op.te.params:
        if name in op.te.scalars:
            args.append(1.0)
        else:
            dt = op.te.tensors[name].dtype
            args.append(np.zeros(shapes[name], dt.numpy))
    return args, {k: v for k, v in case.items() if k in op.te.cparams}


def _cases():
    for name, cases in CASES.items():
        for i, case in enumerate(cases):
            yield pytest.param(name, case, id=f"{name}-{i}")
    yield pytest.param("softmax", dict(N=512, C=4096), id="softmax-big")
    yield pytest.param("layernorm", dict(N=1024, D=768), id="layernorm-big")
    yield pytest.param("matmul", dict(M=256, K=256, N=256), id="matmul-big")


@pytest.mark.parametrize("name,case", list(_cases()))
def test_example_compiles_to_cubin(name, case):
    lib = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda", arch="sm_90")
    op = lib[name]
    args, cparams = _fake_args(op, case)
    lowered = op.lowered(op.bindings_for(tuple(args), cparams))
    artifact = rt.build(lowered.scheduled, CudaTarget.for_arch("sm_90"))
    kernel = rt.load(name, artifact)  # parses; loading a module waits for a GPU
    assert kernel.meta["arch"] == "sm_90" and all(c.startswith(b"\x7fELF") for c in kernel.cubins)
    assert kernel.meta["kernels"], "every example launches at least one kernel"
    for k in kernel.meta["kernels"]:
        assert k["block"] % 32 == 0 and k["grid"] >= 1


def _kernels(op, args):
    body = op.lowered(op.bindings_for(args, {})).scheduled.body
    while not isinstance(body, (Seq, For)):
        body = body.body
    return body.stmts if isinstance(body, Seq) else (body,)


def test_every_kernel_is_a_block_loop_with_guards():
    for name, args in (("softmax", (np.zeros((7, 33), np.float32),)),
                       ("axpy", (1.0, np.zeros(7000, np.float32), np.zeros(7000, np.float32)))):
        op = tcc.compile(EXAMPLES / f"{name}.tc", target="cuda")[name]
        kernels = _kernels(op, args)
        assert kernels and all(isinstance(k, For) and k.kind == "block.x" for k in kernels)
    assert "if gid < 7000:" in op.lower(*args, stage="scheduled")  # 7000 elements in blocks of 256


def test_row_reductions_use_block_allreduce():
    lib = tcc.compile(EXAMPLES / "layernorm.tc", target="cuda")
    x, g = np.zeros((8, 4096), np.float32), np.zeros(4096, np.float32)
    src = lib.layernorm.lower(x, g, g, stage="cuda")
    assert src.count("tcc_block_allreduce(") == 3  # mu, var (+ the preamble's definition)
    assert 'extern "C" __global__' in src and "__launch_bounds__(256)" in src


def test_stages_without_a_gpu():
    lib = tcc.compile(EXAMPLES / "hmm.tc", target="cuda", arch="sm_80")
    a = np.zeros((7, 33), np.float16)
    b = np.zeros((33, 5), np.float16)
    src = lib.hmm.lower(a, b, stage="cuda")
    assert "tcc_f16_to_f32" in src and "#include" not in src
    ptx = lib.hmm.lower(a, b, stage="ptx")
    assert ".target sm_80" in ptx and ".entry tcc_hmm_k0" in ptx


def test_semantic_helpers_are_in_the_code():
    src = """
    op f(A: i32[N], B: i32[N], X: f16[N], Y: bf16[N]) -> (Q: i32[N], R: i32[N], Z: f16[N], W: bf16[N]) {
        Q[i] = A[i] // B[i]
        R[i] = A[i] % B[i]
        Z[i] = max(X[i], X[i] * X[i])
        W[i] = exp(Y[i]) + 1.0
    }
    """
    lib = tcc.compile(src, target="cuda")
    func = lib.f.lowered({"N": 5}).scheduled
    code = cuda_c.generate(func, lib.f.target).source
    for helper in ("tcc_floordiv(", "tcc_mod(", "tcc_max(", "tcc_round_f16(", "tcc_f32_to_bf16(", "expf("):
        assert helper in code, helper
    assert nvrtc.compile_cubin(code, "sm_90").startswith(b"\x7fELF")


def test_names_that_are_c_keywords():
    src = """
    op f(int: f32[N], float: f32[N]) -> max: f32[N] {
        max[threadIdx] = int[threadIdx] + float[threadIdx]
    }
    """
    lib = tcc.compile(src, target="cuda")
    code = cuda_c.generate(lib.f.lowered({"N": 5}).scheduled, lib.f.target).source
    nvrtc.compile_cubin(code)


def test_bad_arch_is_an_error():
    with pytest.raises(TccCompileError, match="architecture"):
        nvrtc.check_arch("gfx90a")
    assert nvrtc.check_arch(90) == "sm_90"


def test_nvrtc_error_shows_the_generated_line():
    bad = 'extern "C" __global__ void k(float* x) {\n    x[0] = undefined_thing;\n}\n'
    with pytest.raises(TccCompileError) as info:
        nvrtc.compile_cubin(bad)
    assert "undefined_thing" in str(info.value) and "generated line 2" in str(info.value)


def test_corrupt_artifact_is_a_tcc_error():
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    func = lib.axpy.lowered({"N": 8}).scheduled
    art = rt.build(func)
    for bad in (b"", b"junk", art[:40], art[:-len(art) // 2].replace(b"\x7fELF", b"XXXX")):
        with pytest.raises(TccError):
            rt.load("axpy", bad)


def test_cache_key_holds_the_arch():
    a = rt.BACKEND.cache_key(rt.machine(None, {"arch": "sm_90"}))
    b = rt.BACKEND.cache_key(rt.machine(None, {"arch": "sm_80"}))
    assert a != b and "nvrtc-" in a


def test_devices_of_a_call_must_agree():
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = rt.DeviceTensor(1 << 20, (4,), tcc.dtypes.f32, 0, None, "cai")
    y = rt.DeviceTensor(1 << 21, (4,), tcc.dtypes.f32, 1, None, "cai")
    with pytest.raises(TccArgumentError, match="argument Y of axpy is on cuda:1 but argument X is on cuda:0"):
        rt._common_device(lib.axpy.te, {"X": x, "Y": y}, None)


@pytest.mark.skipif(tcc.cuda.is_available(), reason="checks the no-GPU path")
def test_running_without_a_gpu_is_a_clean_error():
    lib = tcc.compile(EXAMPLES / "axpy.tc", target="cuda")
    x = np.ones(4, np.float32)
    with pytest.raises(TccRuntimeError, match="driver|GPU"):
        lib.axpy(2.0, x, x)


def test_batch_folded_im2col_on_cuda_runs_in_the_simulator():
    """Two 7x7 images: im2col makes the batch lead the GEMM's columns (one GEMM of 98 columns,
    see te/im2col.py::_promote_columns); the CUDA schedule of that graph, run by the simulator,
    matches the CPU."""
    rng = np.random.default_rng(8)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 7, 7), (16, 5, 3, 3), (16,)))
    op = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", conv="im2col").conv2d
    assert "into columns n, y, x" in op.stage_text({**op.te.cparams, "N": 2, "C": 5, "H": 7, "W": 7, "F": 16,
                                                     "KH": 3, "KW": 3, "P": 1}, "fused")
    arrays = {"X": x, "Wt": w, "b": b, "Y": np.full((2, 16, 7, 7), np.nan, np.float32)}
    gpu_sim.run(op.lowered(op.bindings_for((x, w, b), {"P": 1})).scheduled, arrays)
    np.testing.assert_allclose(arrays["Y"], tcc.compile(EXAMPLES / "conv2d.tc").conv2d(x, w, b, P=1),
                               rtol=1e-4, atol=1e-4)


def test_im2col_on_cuda_runs_in_the_simulator():
    """conv="im2col" on CUDA: fusion keeps the patch GEMM out of the batch loop's group there, so
    the patches are one global buffer and each statement a kernel; checked by the CPU simulator
    of scheduled CUDA loop IR (tests/gpu_sim.py) against the CPU."""
    rng = np.random.default_rng(7)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 6, 7), (8, 4, 3, 3), (8,)))
    op = tcc.compile(EXAMPLES / "conv2d.tc", target="cuda", conv="im2col").conv2d
    arrays = {"X": x, "Wt": w, "b": b, "Y": np.full((1, 8, 6, 7), np.nan, np.float32)}
    gpu_sim.run(op.lowered(op.bindings_for((x, w, b), {"P": 1})).scheduled, arrays)
    np.testing.assert_allclose(arrays["Y"], tcc.compile(EXAMPLES / "conv2d.tc").conv2d(x, w, b, P=1),
                               rtol=1e-4, atol=1e-4)
    assert "tcc_conv2d_k0" in tcc.compile(EXAMPLES / "conv2d.tc", target="cuda").conv2d.lower(x, w, b, P=1,
                                                                                               stage="cuda")


def test_contractions_get_the_tiled_schedule():
    from tcc.passes.autoschedule_cuda import gemm

    lib = tcc.compile(EXAMPLES / "conv2d_relu.tc", target="cuda")
    x, w, b = np.zeros((2, 16, 15, 17), np.float32), np.zeros((24, 16, 3, 3), np.float32), np.zeros(24, np.float32)
    src = lib.conv2d_relu.lower(x, w, b, stage="cuda")
    assert "__syncthreads();" in src and "__shared__ __align__(16) float" in src and src.count("__global__") == 1
    assert nvrtc.compile_cubin(src).startswith(b"\x7fELF")
    mm = tcc.compile(EXAMPLES / "matmul.tc", target="cuda").matmul
    matvec = mm.lower(np.zeros((64, 32), np.float32), np.zeros((32, 1), np.float32), stage="cuda")
    assert "__shared__" not in matvec.split('extern "C"')[1]  # N = 1: one thread per output
    assert gemm.choose_tile(4096, 4096, 1) == (128, 128, 16)
    assert gemm.choose_tile(64, 3136, 8)[0] == 64  # no 128-row tiles for 64 output channels
    assert gemm.choose_tile(1024, 1024, 1) == (64, 64, 16)  # a full grid before large tiles


def test_driver_constants_are_cuda_h_values():
    """The driver is called through ctypes with cuda.h's numbers: they match cuda-python's enums."""
    d = pytest.importorskip("cuda.bindings.driver")
    for name, value in driver.ATTRIBUTES.items():
        assert int(getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")) == value, name
    assert int(d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == driver.MEMPOOL_ATTR_RELEASE_THRESHOLD
    assert int(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == driver.POINTER_ATTRIBUTE_DEVICE_ORDINAL
    for name in ("SUCCESS", "ERROR_OUT_OF_MEMORY", "ERROR_INVALID_CONTEXT", "ERROR_INVALID_HANDLE",
                 "ERROR_ILLEGAL_ADDRESS", "ERROR_CONTEXT_IS_DESTROYED", "ERROR_LAUNCH_FAILED"):
        assert int(getattr(d.CUresult, f"CUDA_{name}")) == getattr(driver, name), name


def test_the_cuda_runtime_imports_no_code_generator():
    """A warm start loads cubin from the cache: loading the CUDA runtime imports neither the code
    generators nor NVRTC's or the driver's Python bindings."""
    code = ("import sys, tcc, tcc.runtime.cuda\n"
            "print(sorted(m for m in sys.modules if m.startswith(('tcc.codegen_cuda.cuda_c', "
            "'tcc.codegen_cuda.gemm', 'tcc.codegen_cuda.tensorcore', 'cuda.bindings.nvrtc', "
            "'cuda.bindings.driver'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": child_pythonpath(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_half_contractions_use_tensor_cores():
    """16-bit contractions run on the matrix units: wgmma (sm_90a) where the copy-engine layout fits
    a large problem, with an mma.sync kernel for misaligned pointers; mma.sync alone otherwise."""
    hmm = tcc.compile(EXAMPLES / "hmm.tc", target="cuda").hmm
    for (m, k, n), wgmma in (((4096, 4096, 4096), True), ((129, 70, 65), False), ((2, 16, 2), False)):
        sizes = dict(M=m, K=k, N=n)
        meta, ptx = _meta(hmm, sizes)
        assert ("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ptx) == wgmma
        assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= 2
        assert [k["shared"] > 48 * 1024 for k in meta["kernels"]] == ([True, False] if wgmma else [False])
    bf = tcc.compile("op g(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] "
                     "{ C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }", target="cuda").g
    ptx = bf.stage_text(dict(M=64, K=48, N=80), "ptx")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx and "ld.local" not in ptx
    mm = tcc.compile(EXAMPLES / "matmul.tc", target="cuda").matmul
    src = mm.lower(np.zeros((256, 64), np.float32), np.zeros((64, 128), np.float32), stage="cuda")
    assert "mma.sync" not in src  # f32 stays on the FMA path


def test_tiled_gemms_keep_their_registers():
    """Double-buffered tiles and register staging, with nothing spilled to local memory."""
    mm = tcc.compile(EXAMPLES / "matmul.tc", target="cuda").matmul
    a = np.zeros((4096, 4096), np.float32)
    ptx = mm.lower(a, a, stage="ptx")
    assert "ld.local" not in ptx and "st.local" not in ptx
    hmm = tcc.compile(EXAMPLES / "hmm.tc", target="cuda").hmm
    h = np.zeros((4096, 4096), np.float16)
    assert "ld.local" not in hmm.lower(h, h, stage="ptx")


def _meta(op, bindings: dict) -> tuple[dict, str]:
    """(the launch plan, the PTX) of ``op`` specialised to ``bindings``."""
    artifact = rt.build(op.lowered(bindings).scheduled, CudaTarget.for_arch("sm_90"))
    return rt._parse(artifact)[0], op.stage_text(bindings, "ptx")


def test_aligned_variants_compile_with_their_fallbacks():
    """16-byte loads where sizes allow (float4 flat kernels; cp.async + ldmatrix tensor cores),
    each flagged aligned and followed by the kernel the launcher runs for misaligned pointers."""
    axpy = tcc.compile(EXAMPLES / "axpy.tc", target="cuda").axpy
    meta, ptx = _meta(axpy, dict(N=4096))
    assert [k["aligned"] for k in meta["kernels"]] == [True, False]
    assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx
    assert [k["aligned"] for k in _meta(axpy, dict(N=4097))[0]["kernels"]] == [False]
    hmm = tcc.compile(EXAMPLES / "hmm.tc", target="cuda").hmm
    lin = tcc.compile("op hlin(A: f16[M, K], W: f16[N, K]) -> C: f32[M, N] "
                      "{ C[i, j] = sum[k](f32(A[i, k]) * f32(W[j, k])) }", target="cuda").hlin
    bf = tcc.compile("op g(A: bf16[M, K], B: bf16[K, N]) -> C: f32[M, N] "
                     "{ C[i, j] = sum[k](f32(A[i, k]) * f32(B[k, j])) }", target="cuda").g
    for op, sizes, fast in ((hmm, (4096, 4096, 4096), True), (hmm, (129, 72, 200), True),
                            (hmm, (129, 70, 65), False), (hmm, (64, 64, 60), False),
                            (lin, (100, 64, 72), True), (lin, (130, 200, 257), True), (bf, (64, 48, 80), True)):
        meta, ptx = _meta(op, dict(zip("MKN", sizes)))
        assert [k["aligned"] for k in meta["kernels"]] == ([True, False] if fast else [False])
        assert ("cp.async.cg.shared.global" in ptx and "ldmatrix" in ptx) == fast
        assert "ld.local" not in ptx and "st.local" not in ptx


def test_cache_key_does_not_load_nvrtc():
    """A warm start reads NVRTC's version from its package, not by loading NVRTC's bindings."""
    try:
        importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("NVRTC not installed by pip: its version comes from NVRTC itself")
    script = ("import sys; from tcc.runtime import cuda; key = cuda.cache_key(cuda.machine()); "
              "assert 'nvrtc-pip-' in key, key; assert 'cuda.bindings.nvrtc' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": child_pythonpath(EXAMPLES.parent)})
    assert out.stdout.strip() == "ok", out.stderr


def test_negated_negative_constants_compile():
    """``-`` before a negative literal is not ``--`` (a fuzzer find: ``abs(-1)`` on integers)."""
    src = "op f(X: i64[N]) -> (Y: i64[N], Z: f32[N]) {\n    Y[i] = abs(X[i] * 0 - 1) + -(-1)\n" \
          "    Z[i] = f32(abs(-1)) - f32(-(X[i] * 0 - 1))\n}"
    op = tcc.compile(src, target="cuda").f
    assert "--" not in op.stage_text(dict(N=7), "cuda").split("tcc_f_k")[1]
    assert ".entry" in op.stage_text(dict(N=7), "ptx")


# Fuzz seed 17157: NVRTC 13.0 itself crashed (SIGSEGV in NVVM) on this kernel while tcc_floordiv
# returned early; the product's loop of f64 tanh next to `(K // X1[0]) % 3` is what it needs.
_NVRTC_CRASHER = """
op fz0(X1: i64[N], X2: f32[K, K]) -> (Y0: bf16[K, K], Y1: f32[N, K, N]) {
    T3: f64[K, 4]
    T3[i, j] = X1[j % (N)]
    T4: f16[K, K]
    T4[i, j] = (T3[i, i % (4)] - T3[i, 0])
    Y0[i, j] = (sum[k1: K](min[k2: N](2)) / (abs(max[k3](bf16(T3[k3, (j + 1) % (4)]))) + 1.0))
    Y1[i, j, l] = prod[k1]((1.0 + 0.05 * tanh((select((X1[k1] > -3) and (X2[j, j] != 0.5),
                                                     f32(X1[i % (N)]), T4[j, j])
                                              / (abs(((K // X1[0]) % 3)) + 1.0)))))
}
"""


def test_nvrtc_survives_floordiv_by_a_loaded_divisor(tmp_path):
    """In a child process, so that a crash of NVRTC fails this test instead of ending pytest."""
    code = tcc.compile(_NVRTC_CRASHER, target="cuda").fz0.stage_text(dict(K=5, N=5), "cuda")
    (tmp_path / "k.cu").write_text(code)
    script = ("import sys; from tcc.codegen_cuda import nvrtc; "
              "print(nvrtc.compile_cubin(open(sys.argv[1]).read(), 'sm_90')[:4])")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "k.cu")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": child_pythonpath(ROOT)})
    assert done.returncode == 0 and "ELF" in done.stdout, (done.returncode, done.stderr[-2000:])


_THREE_KERNELS = """
op three(A: f32[M, K], B: f32[K, N], X: f32[M]) -> (C: f32[M, N], S: f32[M], Y: f32[M]) {
    C[i, j] = sum[k](A[i, k] * B[k, j])
    S[i] = sum[j](C[i, j] * C[i, j])
    Y[i] = exp(X[i]) + S[(i + 1) % M]
}
"""


def test_a_large_program_compiles_as_several_units(monkeypatch):
    """Each unit is the preamble and some kernels, every kernel in exactly one unit; the artifact
    holds one cubin per unit and names each kernel's."""
    op = tcc.compile(_THREE_KERNELS, target="cuda").three
    func = op.lowered(dict(M=300, K=40, N=70)).scheduled
    program = cuda_c.generate(func, op.target)
    assert len(program.kernels) >= 3
    units = program.units(3)
    assert sorted(k for _, kernels in units for k in kernels) == list(range(len(program.kernels)))
    monkeypatch.setattr(rt, "UNIT_CHARS", 1)
    monkeypatch.setattr(rt, "host_cores", lambda: 3)
    meta, cubins = rt._parse(rt.build(func, CudaTarget.for_arch("sm_90")))
    assert len(cubins) == len(units) == len(meta["modules"]) and all(c.startswith(b"\x7fELF") for c in cubins)
    for k in meta["kernels"]:  # each kernel is defined in the cubin its entry names
        assert k["name"].encode() in cubins[k["module"]]
