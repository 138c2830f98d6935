"""LLVM IR -> optimised object code for a CpuTarget -> a callable, through llvmlite's MCJIT.

The target value alone decides LLVM's triple, CPU and features: a ``CpuTarget`` for AVX2 gets
AVX2 code on an AVX-512 host. Only the engine that links a loaded object is the host's.

Object code (not IR) is what the compile cache stores, so a warm start skips LLVM's
optimiser and code generator entirely and only links the object into a fresh engine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass

import llvmlite.binding as llvm

from tcc.codegen_cpu import pool
from tcc.errors import TccCompileError
from tcc.target import CpuTarget

_LOCK = pool.LLVM_LOCK
KERNEL_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def load_soft_float_runtime() -> None:
    """Load libgcc's conversion routines (``__truncdfhf2``: f64 -> f16, and the f16 helpers on
    hosts without F16C). x86 has no instruction for them, so LLVM emits calls; an engine that
    cannot resolve a call jumps to address 0. A host without libgcc_s cannot run f16 kernels."""
    for find in (lambda: "libgcc_s.so.1", lambda: ctypes.util.find_library("gcc_s")):  # the search runs ldconfig
        name = find()
        if not name:
            continue
        try:
            llvm.load_library_permanently(name)
            return
        except RuntimeError:
            continue
    raise TccCompileError("cannot load libgcc_s, which f16 conversions need on this host",
                          hint="install the GCC runtime library (libgcc-s1)")


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc reuse freed scratch buffers instead of unmapping them.

    Kernels malloc their large buffers (im2col patches, packed panels, per-thread scratch) on
    every call. By default glibc serves blocks of a few MiB with a fresh mmap and unmaps them on
    free, so every call page-faults and zeroes its buffers again (20-35% of a convolution's time
    measured here). With the mmap threshold at 32 MiB and the trim threshold at 64 MiB they come
    from the heap and are reused. Skipped where the user tunes malloc through its environment.
    """
    if any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False


@functools.cache
def host() -> tuple[str, str, str]:
    """(triple, cpu name, cpu features) of this machine; part of every cache key."""
    _init()
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def new_target_machine(triple: str, cpu: str, features: str, opt: int = 3) -> llvm.TargetMachine:
    _init()
    target = llvm.Target.from_triple(triple or llvm.get_process_triple())
    return target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic",
                                        codemodel="jitdefault")


@functools.cache
def _shared_machine(triple: str, cpu: str, features: str, opt: int) -> llvm.TargetMachine:
    return new_target_machine(triple, cpu, features, opt)


def target_machine(target: CpuTarget, opt: int = 3) -> llvm.TargetMachine:
    """The shared machine for optimising and emitting code for ``target`` at an optimisation level
    (engines get their own: they own it)."""
    return _shared_machine(target.triple, target.isa, target.features, opt)


@dataclass(frozen=True)
class Level:
    """How hard LLVM works on a module: its IR pipeline (-O) and its code generator's level."""

    passes: int
    codegen: int


FULL = Level(3, 3)
# For a kernel whose loops tcc already vectorised and unrolled: the code generator's O3 found
# nothing more than its O2 (matmul 256, conv2d 3x3 64->64 56x56, softmax, layernorm, maxpool,
# bias_relu, axpy: the same run time, min of 25, within 2%) and takes longer. The IR pipeline
# stays at O3: at O1 and O2 a ResNet-style ONNX model's logits moved by 1% (tests/test_onnx.py).
# Reduced to a 3x3 pad-1 conv 16->16 on a 5x5 image (tests/test_fuzz_regressions.py): with the
# IR pipeline at O1, -opt-bisect-limit puts the change at the loop unroller's output, which reads
# as the same program; the same IR is right with the code generator at O0 and wrong (lane 24 of
# 25-lane vectors: 3 x 8 + 1 on AVX2) with it at O1-O3, so the suspect is x86 instruction
# selection of odd-width vectors, not tcc's IR.
# LLVM's loop unroller stays on for innermost loops only (llvm_loops._holds_loop): off entirely, a
# register tile's reduction lost its partial unrolling (matmul 256 30% slower); on for every loop,
# it copied outer loops whole (conv2d 3x3 64->64 56x56: twice the object code and LLVM time).
VECTORIZED = Level(3, 2)


def optimize(ir_text: str, target: CpuTarget, level: Level = FULL) -> llvm.ModuleRef:
    """Parse, verify and run LLVM's pipeline at ``level`` on a module, then verify what the
    pipeline made. LLVM 22's SROA can emit a shuffle before a value it reads (it merges partial
    vector stores into an alloca in offset order, not program order: llvm/llvm-project#189680,
    fixed after 22.1; fuzz seed 1270, a ceil_mode MaxPool's row buffer), and the code generator
    aborts the process on such IR. Then the pipeline runs again at O1, or O0, which gave valid IR.
    Modules live in LLVM's global context, which is not thread-safe (llvmlite releases the GIL in
    LLVM): one thread at a time."""
    _init()
    with _LOCK:
        for passes in dict.fromkeys((level.passes, min(level.passes, 1), 0)):
            mod = _parse(ir_text)
            _run_pipeline(mod, target_machine(target, level.codegen), passes)
            try:
                mod.verify()
            except RuntimeError:
                continue
            return mod
    raise TccCompileError("internal error: LLVM's optimiser made invalid IR at every level")


def _parse(ir_text: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as exc:
        raise TccCompileError(f"internal error: generated LLVM IR is invalid: {exc}") from None
    return mod


def _run_pipeline(mod: llvm.ModuleRef, tm: llvm.TargetMachine, passes: int) -> None:
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=passes)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


def emit_object(mod: llvm.ModuleRef, target: CpuTarget, level: Level = FULL) -> bytes:
    with _LOCK:
        return target_machine(target, level.codegen).emit_object(mod)


def emit_assembly(mod: llvm.ModuleRef, target: CpuTarget, level: Level = FULL) -> str:
    with _LOCK:
        return target_machine(target, level.codegen).emit_assembly(mod)


class LoadedObject:
    """An object file linked into its own execution engine; keeps the code alive."""

    def __init__(self, obj: bytes):
        _init()
        pool.available()  # a cached object may call tcc_parallel: resolve it before linking
        load_soft_float_runtime()
        keep_freed_memory()
        with _LOCK:
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine(*host()))
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self._engine.finalize_object()

    def function(self, symbol: str) -> ctypes._CFuncPtr:
        address = self._engine.get_function_address(symbol)
        if not address:
            raise TccCompileError(f"internal error: symbol {symbol} missing from compiled object")
        return KERNEL_PROTOTYPE(address)
