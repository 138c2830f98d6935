"""CUDA C -> cubin (or PTX text, for reading) through NVRTC; needs no GPU.

We always load **cubin** built for the device's exact architecture: the driver on the GPU
machines may be older than this NVRTC, and it cannot JIT PTX from a newer toolkit.
Compiler diagnostics become :class:`~tcc.errors.TccCompileError` quoting the generated line.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from tcc.errors import TccCompileError

DEFAULT_ARCH = "sm_90"
_ARCH = re.compile(r"^sm_(\d+)[af]?$")
_DIAG = re.compile(r"^tcc\.cu\((\d+)\): (error|catastrophic error|warning)", re.MULTILINE)


def check_arch(arch: Any) -> str:
    """``arch`` as ``sm_NN``; a clear error for anything else."""
    text = str(arch)
    if text.isdigit():
        text = f"sm_{text}"
    m = _ARCH.match(text)
    if m is None or int(m.group(1)) < 50:
        raise TccCompileError(f"unknown CUDA architecture {arch!r}",
                              hint="use the device's compute capability, e.g. arch='sm_90' (H100/H200), "
                                   "'sm_80' (A100), 'sm_89' (L4)")
    return text


@functools.cache
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise TccCompileError(f"target='cuda' needs NVRTC through cuda-python ({exc})",
                              hint='pip install "cuda-bindings>=13.0,<14" nvidia-cuda-nvrtc==13.0.88 '
                                   "(the 'cuda' extra of tcc)") from None
    return nvrtc


def version() -> str:
    """NVRTC's version, ``major.minor``; part of every CUDA cache key."""
    err, major, minor = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def compile_cubin(source: str, arch: str = DEFAULT_ARCH) -> bytes:
    """Machine code for ``arch``."""
    return _compiled(source, f"--gpu-architecture={check_arch(arch)}", "CUBIN")


def ptxas_report(source: str, arch: str = DEFAULT_ARCH) -> str:
    """ptxas's account of each kernel of ``source`` built for ``arch`` (registers, spills, shared
    memory): what a hand-written template's tile sizes are checked against."""
    prog = _compile(source, f"--gpu-architecture={check_arch(arch)}", "--ptxas-options=-v")
    try:
        return _log(prog)
    finally:
        _nvrtc().nvrtcDestroyProgram(prog)


def compile_ptx(source: str, arch: str = DEFAULT_ARCH) -> str:
    """PTX assembly for the virtual architecture of ``arch`` (to read; never loaded)."""
    virtual = check_arch(arch).replace("sm_", "compute_")
    return _compiled(source, f"--gpu-architecture={virtual}", "PTX").rstrip(b"\0").decode()


def _compiled(source: str, option: str, kind: str) -> bytes:
    """Compile and fetch NVRTC's output of ``kind`` ("CUBIN" or "PTX"), freeing the program."""
    prog = _compile(source, option)
    nvrtc = _nvrtc()
    try:
        err, size = getattr(nvrtc, f"nvrtcGet{kind}Size")(prog)
        _check(err, f"nvrtcGet{kind}Size")
        out = b" " * size
        _check(getattr(nvrtc, f"nvrtcGet{kind}")(prog, out)[0], f"nvrtcGet{kind}")
        return out
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile(source: str, arch_option: str, *extra: str):
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"tcc.cu", 0, [], [])
    _check(err, "nvrtcCreateProgram")
    options = [arch_option.encode(), b"--std=c++17", b"--device-as-default-execution-space",
               *(x.encode() for x in extra)]
    (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = _log(prog)
        nvrtc.nvrtcDestroyProgram(prog)
        raise _compile_error(source, log)
    return prog


def _log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace")


def _compile_error(source: str, log: str) -> TccCompileError:
    """The first diagnostic, with the generated line it points at."""
    lines = source.splitlines()
    m = _DIAG.search(log)
    where = ""
    if m is not None:
        lineno = int(m.group(1))
        text = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        where = f"\n  generated line {lineno}: {text}"
    first = next((ln for ln in log.splitlines() if "error" in ln), log.strip()[:500])
    return TccCompileError(f"NVRTC rejected the generated CUDA C: {first}{where}",
                           hint="this is a tcc bug; `op.lower(..., stage='cuda')` shows the whole program")


def _check(err, what: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise TccCompileError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
