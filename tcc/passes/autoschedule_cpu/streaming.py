"""stream_results: mark the large results a kernel only writes for non-temporal stores.

A result that is several times the L2 cache and never read back by the kernel gains nothing from
passing through the cache: its unit-stride vector stores can write whole lines around it (a
third less memory traffic for ``relu(a*b + c)``, and what the loop reads is not evicted). The
decision is the schedule's; the code generator only reads the mark, the function attribute
``streamed`` (printed in the loop IR), and emits the stores where they are whole aligned lines.
A result of a dynamic size is named in ``streamed_from`` too, with the bytes from which it is
streamed: the kernel compares its size at the call.
"""

from __future__ import annotations

from dataclasses import replace

from tcc.ir.loopnest import loads
from tcc.ir.loops import Buffer, LoopFunc
from tcc.target import CpuTarget

STREAM_L2S = 4  # results of at least this many L2s (8 MiB on the development host, where a
# 4096x1024 softmax and layernorm got 5-15% faster that way) bypass the cache


def stream_bytes(target: CpuTarget) -> int:
    """Results at least this large take non-temporal stores on ``target``."""
    return STREAM_L2S * target.cache_bytes(2)


def stream_results(func: LoopFunc, target: CpuTarget) -> LoopFunc:
    """``func`` with its large write-only results named in ``attrs["streamed"]``, on targets with
    AVX-512 (64-byte vector stores fill a cache line)."""
    if not target.avx512:
        return func
    read = {ld.buffer for ld in loads(func.body)}
    results = [p for p in func.params if isinstance(p, Buffer) and p.name not in read]
    streamed = tuple(p.name for p in results if p.static and p.size * p.dtype.itemsize >= stream_bytes(target))
    # a result whose size dynamic shape symbols give: streamed at the calls where it is that large
    dynamic = tuple((p.name, stream_bytes(target)) for p in results if not p.static)
    attrs = {**func.attrs, "streamed": streamed + tuple(name for name, _ in dynamic)}
    if dynamic:
        attrs["streamed_from"] = dynamic
    return replace(func, attrs=attrs) if attrs["streamed"] else func
