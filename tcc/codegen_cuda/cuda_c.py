"""Scheduled loop IR -> readable CUDA C, one ``__global__`` function per kernel.

A scheduled CUDA function is ``Allocate(global temps) -> Seq(kernel, ...)`` where every
kernel is a loop bound to ``block.x`` (see :mod:`tcc.passes.autoschedule_cuda.schedule`). Codegen decides
nothing: a ``block.x``/``thread.x`` loop becomes ``blockIdx.x``/``threadIdx.x`` and its
extent the launch shape, a thread loop annotated ``allreduce=ACC:OP`` ends in a block-wide
combination of the local accumulator ``ACC``, scopes map to registers and ``__shared__``.

Semantics are the CPU backend's (NumPy's): integer ``//`` and ``%`` floor and give 0 for a
zero divisor, float ``max``/``min`` propagate NaN, bools are bytes in memory. ``f16`` and
``bf16`` are 16-bit patterns in memory and ``float`` in registers, rounded to their precision
after every operation, so each operation is computed in f32 and rounded once, as IEEE half
arithmetic does; ``f8e4m3`` and ``f8e5m2`` likewise, bytes in memory, with saturating
conversions (:data:`.preamble.FP8_PREAMBLE`, added to programs that use them).
The C helpers every program starts with are in :mod:`.preamble`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tcc import dtypes
from tcc.codegen_cuda.cuda_matrix import MatrixStatements
from tcc.codegen_cuda.cuda_values import (
    MEMORY_TYPE,
    NARROW,
    VALUE_TYPE,
    const_text,
    convert,
    from_memory,
    round_to,
    to_memory,
    wrap,
)
from tcc.codegen_cuda.cuda_vector import VectorAccesses
from tcc.codegen_cuda.flash import FLASH, FLASH_WARPGROUP
from tcc.codegen_cuda.flash_backward import FLASH_BACKWARD
from tcc.codegen_cuda.launch_sizes import Formula, formula
from tcc.codegen_cuda.names import c_name
from tcc.codegen_cuda.preamble import FP8_PREAMBLE, PREAMBLE
from tcc.dtypes import DType
from tcc.errors import TccCompileError
from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Unary, Var, free_vars, walk
from tcc.ir.loopnest import buffer_elements, shared_layout
from tcc.ir.loops import (
    GUARD_PARAM,
    GUARDED,
    MIN_BLOCKS,
    REQUIRES,
    Allocate,
    Barrier,
    BlockScan,
    Buffer,
    For,
    If,
    Let,
    LoopFunc,
    Seq,
    Stmt,
    Store,
    WarpgroupMma,
    stmt_exprs,
    walk_stmts,
)
from tcc.ir.matrix_loops import MatrixStream, MatrixSweep
from tcc.passes.autoschedule_cuda.scatter import ATOMIC_DTYPES
from tcc.passes.simplify import evaluate_int
from tcc.target import CudaTarget

_C_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and": "&&", "or": "||"}
_MATH_F32 = {"exp": "expf", "log": "logf", "sqrt": "sqrtf", "rsqrt": "rsqrtf", "sin": "sinf", "cos": "cosf",
             "tanh": "tanhf", "erf": "erff", "abs": "fabsf", "floor": "floorf", "ceil": "ceilf"}



@dataclass
class KernelInfo:
    """What the runtime needs to launch one kernel."""

    name: str
    grid: Formula  # blocks: a number, or a formula of the dynamic shape symbols (launch_sizes)
    block: int
    params: list[tuple[str, str]]  # (parameter name in the LoopFunc, ctype code: "p" pointer or a dtype)
    aligned: bool = False  # launch only when every pointer is 16-byte aligned; else the next kernel
    shared: int = 0  # bytes of dynamic shared memory
    requires: Formula | None = None  # launch only when this condition of the symbols is 1 (aligned: else the next)


@dataclass
class CudaProgram:
    """The CUDA C of a function and the launch plan that goes with it."""

    source: str
    kernels: list[KernelInfo]
    temps: list[tuple[str, Formula]]  # global intermediates: (name, bytes, a formula where dynamic)
    line_spans: dict[int, object] = field(default_factory=dict)
    arch_specific: bool = False  # uses sm_90a instructions (wgmma): compile for sm_90a, not sm_90
    kernel_texts: list[str] = field(default_factory=list)  # each kernel's C, in ``kernels``' order
    preamble: str = PREAMBLE  # the helpers every unit starts with

    def units(self, count: int) -> list[tuple[str, list[int]]]:
        """The program cut into at most ``count`` sources that compile on their own (the preamble
        and some of the kernels), balanced by length: (source, indices of its kernels). NVRTC
        compiles one program on one thread, and a whole network's kernels took it ~4 s per
        ResNet-18 (session 7); separate programs compile on several."""
        count = max(1, min(count, len(self.kernel_texts)))
        if count == 1:
            return [(self.source, list(range(len(self.kernels))))]
        groups: list[list[int]] = [[] for _ in range(count)]
        sizes = [0] * count
        for i in sorted(range(len(self.kernel_texts)), key=lambda i: -len(self.kernel_texts[i])):
            least = sizes.index(min(sizes))
            groups[least].append(i)
            sizes[least] += len(self.kernel_texts[i])
        return [("\n".join([self.preamble, *(self.kernel_texts[i] for i in sorted(g))]), sorted(g))
                for g in groups if g]


def generate(func: LoopFunc, target: CudaTarget) -> CudaProgram:
    """CUDA C for a scheduled function; shared buffers beyond ``target``'s static shared memory
    are placed in dynamic shared memory."""
    temps, body = _peel(func.body)
    buffers = {p.name: p for p in func.params if isinstance(p, Buffer)} | {t.name: t for t in temps}
    scalars = [p for p in func.params if isinstance(p, Var)]
    stmts = list(body.stmts) if isinstance(body, Seq) else [body]
    texts: list[str] = []
    kernels = []
    for i, kernel in enumerate(stmts):
        if not (isinstance(kernel, For) and kernel.kind == "block.x"):
            raise TccCompileError("internal error: a CUDA kernel must start with a loop bound to block.x",
                                  hint="schedule the function with tcc.passes.autoschedule_cuda.schedule.schedule_cuda")
        used = _pair_used(stmts, i)
        info, text = _Kernel(f"tcc_{func.name}_k{i}", kernel, buffers, scalars, used, target.shared_per_block,
                             bool(func.attrs.get(GUARDED))).emit()
        kernels.append(info)
        texts.append(text)
    streams = [s for s in walk_stmts(body) if isinstance(s, MatrixStream)]
    sweeps = any(isinstance(s, MatrixSweep) for s in walk_stmts(body))
    warpgroups = any(s.warpgroups for s in streams)
    helpers = [FP8_PREAMBLE] if _uses_fp8(func) else []
    helpers += [FLASH, *([FLASH_WARPGROUP] if warpgroups else [])] if streams or sweeps else []
    helpers += [FLASH_BACKWARD] if sweeps else []
    preamble = "\n".join([PREAMBLE, *helpers])  # every unit starts with it (units())
    source = "\n".join([preamble, *texts])
    specific = warpgroups or any(isinstance(s, WarpgroupMma) for s in walk_stmts(body))
    return CudaProgram(source, kernels, [(t.name, _bytes(t)) for t in temps],
                       arch_specific=specific, kernel_texts=texts, preamble=preamble)


def _uses_fp8(func: LoopFunc) -> bool:
    """Whether ``func`` holds or computes an 8-bit float (its helpers' instructions need sm_89)."""
    if any(p.dtype.is_fp8 for p in func.params):
        return True
    for s in walk_stmts(func.body):
        if isinstance(s, Allocate) and s.buffer.dtype.is_fp8:
            return True
        if any(n.dtype.is_fp8 for e in stmt_exprs(s) for n in walk(e)):
            return True
    return False


def _bytes(buf: Buffer) -> Formula:
    """A global intermediate's bytes (at least one), a formula where its shape is dynamic."""
    if buf.static:
        return max(1, buf.size * buf.dtype.itemsize)
    one = Const(1, dtypes.i64)
    return formula(Binary("max", Binary("mul", buffer_elements(buf.shape), Const(buf.dtype.itemsize, dtypes.i64),
                                        dtypes.i64), one, dtypes.i64))


def _peel(s: Stmt) -> tuple[list[Buffer], Stmt]:
    temps = []
    while isinstance(s, Allocate) and s.buffer.scope == "global":
        temps.append(s.buffer)
        s = s.body
    return temps, s


def is_aligned_variant(kernel: Stmt) -> bool:
    """Whether ``kernel`` assumes 16-byte aligned pointers (the kernel after it is its fallback)."""
    return isinstance(kernel, For) and any(key == "aligned" for key, _ in kernel.annotations)


def _pair_used(stmts: list[Stmt], i: int) -> tuple[set[str], set[str], set[str]]:
    """What kernel ``i`` refers to; a kernel and its fallback share one parameter list."""
    pair = [i]
    if is_aligned_variant(stmts[i]):
        pair.append(i + 1)
    elif i > 0 and is_aligned_variant(stmts[i - 1]):
        pair.append(i - 1)
    if max(pair) >= len(stmts):
        raise TccCompileError("internal error: an aligned kernel variant without its fallback")
    reads, writes, names = set(), set(), set()
    for j in pair:
        r, w, n = _used(stmts[j])
        reads, writes, names = reads | r, writes | w, names | n
    return reads, writes, names


def _used(kernel: Stmt) -> tuple[set[str], set[str], set[str]]:
    """(buffers read, buffers written, variables) that a kernel refers to."""
    reads, writes, names = set(), set(), set()
    for s in walk_stmts(kernel):
        if isinstance(s, For):  # (a condition it requires may read a symbol its loops do not)
            names.update(*(free_vars(v) for k, v in s.annotations if k == REQUIRES))
        if isinstance(s, Store):
            writes.add(s.buffer)
        if isinstance(s, MatrixSweep) and s.dq is not None:  # (dQ's accumulator: added into)
            writes.add(s.dq.buffer)
        for e in stmt_exprs(s):
            for n in walk(e):
                if isinstance(n, Load):
                    reads.add(n.buffer)
                elif isinstance(n, Var):
                    names.add(n.name)
    return reads, writes, names


class _Kernel(MatrixStatements, VectorAccesses):
    """Emits one ``__global__`` function."""

    def __init__(self, name: str, root: For, buffers: dict[str, Buffer], scalars: list[Var],
                 used: tuple[set[str], set[str], set[str]], static_shared: int, guarded: bool = False):
        self.name = name
        self.guarded = guarded  # the call's index checks run first: return when they failed (GUARDED)
        self.static_shared = static_shared  # bytes of shared memory a block may declare statically
        self.root = root
        self.used = used
        self.buffers = dict(buffers)
        self.scalars = scalars
        self.lines: list[str] = []
        self.block = 1
        self.dynamic: dict[str, int] = {}  # shared buffers placed in dynamic shared memory: byte offsets
        self.fragments = sorted({s.acc.buffer for s in walk_stmts(root) if isinstance(s, WarpgroupMma)})

    def emit(self) -> tuple[KernelInfo, str]:
        reads, writes, names = self.used
        names = names | _shape_symbols(self.buffers, reads | writes)
        self.block = self._block_size()
        aligned = is_aligned_variant(self.root)
        params, decls, prologue = [], [], []
        barrier = any(isinstance(s, Barrier) for s in walk_stmts(self.root))
        for buf in self.buffers.values():
            if buf.name in reads or buf.name in writes:
                const = "const " if buf.name not in writes else ""
                ctype = f"{const}{MEMORY_TYPE[buf.dtype.name]}*"
                # A buffer that threads write and then read across a barrier (the nests of a merged
                # kernel) is not __restrict__: NVVM then moved a read of another thread's store
                # above the barrier (train_cnn's softmax gradient read a stale value in 31 of 32 rows).
                shared_through_barrier = barrier and buf.name in reads and buf.name in writes
                restrict = "" if shared_through_barrier else " __restrict__"
                decls.append(f"{ctype}{restrict} {c_name(buf.name)}")
                params.append((buf.name, "p"))
                if aligned:  # checked at launch: lets the compiler merge loads into 16-byte ones
                    prologue.append(f"    {c_name(buf.name)} = ({ctype})__builtin_assume_aligned("
                                    f"{c_name(buf.name)}, 16);")
        for var in self.scalars:
            if var.name not in names:
                continue
            params.append((var.name, var.dtype.name))
            if var.dtype.name in NARROW:  # passed as f32, rounded here
                decls.append(f"float tcc_arg_{c_name(var.name)}")
                prologue.append(f"    const float {c_name(var.name)} = tcc_round_{var.dtype.name}"
                                f"(tcc_arg_{c_name(var.name)});")
            else:
                decls.append(f"{VALUE_TYPE[var.dtype.name]} {c_name(var.name)}")
        if self.guarded:  # queued before the host knows the guard's count: it reads the count itself
            params.append((GUARD_PARAM, "p"))
            decls.append(f"const long long* __restrict__ {GUARD_PARAM}")
            prologue.append(f"    if (*{GUARD_PARAM} != 0) return;  // an index out of range: write nothing")
        shared = self._place_shared()
        if shared:  # 1024-byte aligned (swizzled tiles need it): the driver promises 16
            prologue += ["    extern __shared__ __align__(16) unsigned char tcc_shared_raw[];",
                         "    unsigned char* const tcc_shared = tcc_shared_raw + "
                         "((1024u - (tcc_smem(tcc_shared_raw) & 1023u)) & 1023u);"]
        bounds = "".join([str(self.block), *(f", {v}" for k, v in self.root.annotations if k == MIN_BLOCKS)])
        head = f'extern "C" __global__ void __launch_bounds__({bounds}) {self.name}({", ".join(decls)}) {{'
        requires = next((v for k, v in self.root.annotations if k == REQUIRES), None)
        if requires is not None:  # what the launcher checks, the compiler may assume (a stride's alignment)
            prologue.append(f"    __builtin_assume({self._assumed(requires)});")
        self.lines = [head, *prologue]
        self._stmt(self.root, 1)
        self.lines.append("}")
        info = KernelInfo(self.name, formula(self.root.extent), self.block, params, aligned,
                          shared + 1024 if shared else 0, formula(requires) if requires is not None else None)
        return info, "\n".join(self.lines)

    def _assumed(self, cond: Expr) -> str:
        """C of a kernel's ``requires`` condition: ``E % 2^k == 0`` as a mask, which the compiler
        reads as E's low bits (the alignment of the rows it strides by)."""
        if isinstance(cond, Binary) and cond.op == "eq" and isinstance(cond.a, Binary) and cond.a.op == "mod" \
                and isinstance(cond.a.b, Const) and isinstance(cond.b, Const) and cond.b.value == 0:
            d = int(cond.a.b.value)
            if d > 0 and d & (d - 1) == 0:
                return f"(({self._expr(cond.a.a)}) & {d - 1}LL) == 0"
        return self._expr(cond)

    def _place_shared(self) -> int:
        """Dynamic shared memory for the kernel's shared buffers when they need more than the
        target's static shared memory, a swizzled layout or one takes another's memory
        (``Allocate.reuses``): their offsets, and the bytes in all."""
        allocs = [s for s in walk_stmts(self.root) if isinstance(s, Allocate) and s.buffer.scope == "shared"]
        bufs = [_static(s.buffer) for s in allocs]
        if not any(b.swizzle for b in bufs) and not any(s.reuses for s in allocs) \
                and sum(b.size * b.dtype.itemsize for b in bufs) <= self.static_shared:
            return 0
        offsets, total = shared_layout(self.root, 1024)
        self.dynamic.update(offsets)
        return total

    def _block_size(self) -> int:
        sizes = {_const_extent(s) for s in walk_stmts(self.root) if isinstance(s, For) and s.kind == "thread.x"}
        if len(sizes) > 1:
            raise TccCompileError(f"internal error: kernel {self.name} binds thread.x to extents {sorted(sizes)}")
        if any(isinstance(s, For) and s.kind in ("block.y", "block.z", "thread.y", "thread.z")
               for s in walk_stmts(self.root)):
            raise TccCompileError("internal error: only block.x and thread.x bindings are supported yet")
        return sizes.pop() if sizes else 1

    # ------------------------------------------------------------ statements
    def _line(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def _stmt(self, s: Stmt, depth: int) -> None:
        method = getattr(self, f"_s_{type(s).__name__}", None)
        if method is None:
            raise TccCompileError(f"internal error: the CUDA backend cannot lower {type(s).__name__}")
        method(s, depth)

    def _s_Seq(self, s: Seq, depth: int) -> None:
        for c in s.stmts:
            if isinstance(c, Let) and len(s.stmts) > 1:  # its own scope: a sibling may reuse the name
                self._line(depth, "{")
                self._stmt(c, depth + 1)
                self._line(depth, "}")
            else:
                self._stmt(c, depth)

    def _s_For(self, s: For, depth: int) -> None:
        var = c_name(s.var.name)
        if s.kind in ("block.x", "thread.x"):
            builtin = "blockIdx.x" if s.kind == "block.x" else "threadIdx.x"
            extent = _const_extent(s) if s.kind == "thread.x" else self._expr(s.extent)
            self._line(depth, f"{{  // {s.var.name} in 0..{extent}: {s.kind}")
            self._line(depth + 1, f"const long long {var} = {builtin};")
            self._stmt(s.body, depth + 1)
            for key, value in s.annotations:
                if key == "allreduce":
                    self._allreduce(str(value), depth + 1)
            self._line(depth, "}")
            return
        if s.kind == "vector":  # one wide access (cuda_vector)
            self._vector_loop(s, depth)
            return
        if s.kind == "unroll":
            self._line(depth, "#pragma unroll")
        self._line(depth, f"for (long long {var} = 0; {var} < {self._expr(s.extent)}; ++{var}) {{")
        self._stmt(s.body, depth + 1)
        self._line(depth, "}")

    def _allreduce(self, spec: str, depth: int) -> None:
        acc, op = spec.split(":")
        buf = self.buffers[acc]
        ctype = VALUE_TYPE[buf.dtype.name]
        a, b = Var("a", buf.dtype), Var("b", buf.dtype)
        combine = self._expr(Binary(op, a, b, buf.dtype))
        self._line(depth, f"{c_name(acc)}[0] = tcc_block_allreduce({c_name(acc)}[0], "
                          f"[](const {ctype} a, const {ctype} b) {{ return {combine}; }});")

    def _s_Store(self, s: Store, depth: int) -> None:
        buf = self.buffers[s.buffer]
        if s.accumulate and buf.dtype.name in ATOMIC_DTYPES:
            self._atomic_add(s, buf, depth)
            return
        if buf.scope != "local" and _same_memory(s.value, buf, self.buffers):
            value = self._memory_load(s.value)  # a 16-bit copy stays a bit copy
        elif buf.scope != "local" and _rounded_f32(s.value, buf):  # f16(x) stored: x converted once
            value = to_memory(self._expr(s.value.a), buf.dtype)  # type: ignore[attr-defined]
        else:
            value = self._expr(s.value)
            if buf.scope != "local":
                value = to_memory(value, buf.dtype)
        self._line(depth, f"{c_name(s.buffer)}[{self._flat(buf, s.indices)}] = {value};")

    def _atomic_add(self, s: Store, buf: Buffer, depth: int) -> None:
        """An accumulating store (``+=``, whose threads may hit one element) as ``atomicAdd`` of
        its addend; i64 through the unsigned 64-bit overload (two's complement adds the same)."""
        where = f"&{c_name(s.buffer)}[{self._flat(buf, s.indices)}]"
        value = self._expr(s.addend)
        if buf.dtype.name == "i64":
            where, value = f"(unsigned long long*){where}", f"(unsigned long long)({value})"
        self._line(depth, f"atomicAdd({where}, {value});")

    def _memory_load(self, e: Load) -> str:
        return f"{c_name(e.buffer)}[{self._flat(self.buffers[e.buffer], e.indices)}]"

    def _s_Allocate(self, s: Allocate, depth: int) -> None:
        buf = s.buffer
        if buf.scope == "global":
            raise TccCompileError(f"internal error: global buffer {buf.name} allocated inside a kernel")
        ctype = VALUE_TYPE[buf.dtype.name] if buf.scope == "local" else MEMORY_TYPE[buf.dtype.name]
        if buf.name in self.dynamic:
            self._line(depth, f"{ctype}* const {c_name(buf.name)} = ({ctype}*)(tcc_shared + {self.dynamic[buf.name]});")
        else:
            shared = "__shared__ __align__(16) " if buf.scope == "shared" else ""
            self._line(depth, f"{shared}{ctype} {c_name(buf.name)}[{max(1, _static(buf).size)}];")
        self.buffers[buf.name] = buf
        self._stmt(s.body, depth)

    def _s_If(self, s: If, depth: int) -> None:
        self._line(depth, f"if ({self._expr(s.cond)}) {{")
        self._stmt(s.then, depth + 1)
        if s.otherwise is not None:
            self._line(depth, "} else {")
            self._stmt(s.otherwise, depth + 1)
        self._line(depth, "}")

    def _s_Let(self, s: Let, depth: int) -> None:
        self._line(depth, f"const {VALUE_TYPE[s.var.dtype.name]} {c_name(s.var.name)} = {self._expr(s.value)};")
        self._stmt(s.body, depth)

    def _s_Barrier(self, s: Barrier, depth: int) -> None:
        self._line(depth, "__syncthreads();")

    def _s_MatrixStream(self, s: MatrixStream, depth: int) -> None:
        """A call of ``tcc_flash`` (:mod:`tcc.codegen_cuda.flash`), the statement's expressions and
        stores written as the lambdas it takes."""
        i64 = "long long"
        row, key, dot = (c_name(v.name) for v in (s.row, s.key, s.dot))
        col, w, total, top = (c_name(v.name) for v in (s.col, s.w, s.total, s.top))
        bf16 = "true" if s.q.dtype.name == "bf16" else "false"
        qreg = "true" if s.q_registers else "false"
        aligned = "true" if s.aligned else "false"
        call = (f"tcc_flash_wg<{s.depth}, {s.tile}, {s.warpgroups}, {bf16}, {aligned}>" if s.warpgroups else
                f"tcc_flash<{s.depth}, {s.tile}, {s.warps}, {s.row_tiles}, {qreg}, {bf16}, {aligned}>")
        self._line(depth, f"{call}((unsigned char*){c_name(s.shared)}, "
                          f"(long long)({self._expr(s.first)}), {s.rows}ll, "
                          f"(long long)({self._expr(s.key_begin or Const(0, dtypes.i64))}), "
                          f"(long long)({self._expr(s.key_end or Const(s.keys, dtypes.i64))}),")
        self._line(depth + 1, f"[&]({i64} {row}) {{ return {self._address(s.q)}; }},")
        self._line(depth + 1, f"[&]({i64} {key}) {{ return {self._address(s.k)}; }},")
        self._line(depth + 1, f"[&]({i64} {key}) {{ return {self._address(s.v)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}, {i64} {key}, float {dot}) -> float {{ "
                              f"return {convert(self._expr(s.score), s.score.dtype, dtypes.f32)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}) -> {i64} {{ return ({i64})({self._expr(s.limit)}); }},")
        self._line(depth + 1, f"[&]({i64} {row}, {i64} {col}, float {w}, float {total}, float {top}) {{")
        self._stmt(s.out, depth + 2)
        self._line(depth + 1, "},")
        self._line(depth + 1, f"[&]({i64} {row}, float {total}, float {top}) {{")
        self._stmt(s.row_out, depth + 2)
        self._line(depth + 1, "});")

    def _s_BlockScan(self, s: BlockScan, depth: int) -> None:
        buf = self.buffers[s.buffer]
        ctype = VALUE_TYPE[buf.dtype.name]
        a, b = Var("a", buf.dtype), Var("b", buf.dtype)
        combine = self._expr(Binary(s.op, a, b, buf.dtype))
        self._line(depth, f"tcc_block_exscan({c_name(s.buffer)}, ({ctype})({self._expr(s.identity)}), "
                          f"[](const {ctype} a, const {ctype} b) {{ return {combine}; }});")

    # ------------------------------------------------------------ expressions
    def _flat(self, buf: Buffer, indices: tuple[Expr, ...], swizzled: bool = True) -> str:
        if buf.swizzle:
            return self._swizzled_flat(buf, indices, swizzled)
        terms, stride = [], 1
        for idx, dim in reversed(list(zip(indices, buf.shape))):
            text = str(idx.value) if isinstance(idx, Const) else self._expr(idx)
            if stride != 1:  # a dynamic dim's stride is computed from the symbols (kernel arguments)
                text = f"{text} * {stride if isinstance(stride, int) else self._expr(stride)}"
            terms.append(text)
            stride = buffer_elements((stride, dim))
        return " + ".join(reversed(terms)) or "0"

    def _expr(self, e: Expr) -> str:
        method = getattr(self, f"_e_{type(e).__name__}", None)
        if method is None:
            raise TccCompileError(f"internal error: the CUDA backend cannot lower {type(e).__name__}")
        return method(e)

    def _e_Const(self, e: Const) -> str:
        return const_text(e.value, e.dtype)

    def _e_Var(self, e: Var) -> str:
        return c_name(e.name)

    def _e_Load(self, e: Load) -> str:
        buf = self.buffers[e.buffer]
        text = f"{c_name(e.buffer)}[{self._flat(buf, e.indices)}]"
        return text if buf.scope == "local" else from_memory(text, buf.dtype)

    def _e_Select(self, e: Select) -> str:
        return f"({self._expr(e.cond)} ? {self._expr(e.a)} : {self._expr(e.b)})"

    def _e_Unary(self, e: Unary) -> str:
        a = self._expr(e.a)
        if e.op == "not":
            return f"(!{a})"
        return wrap(f"(-({a}))", e.dtype)

    def _e_Cast(self, e: Cast) -> str:
        return convert(self._expr(e.a), e.a.dtype, e.dtype)

    def _e_Binary(self, e: Binary) -> str:
        a, b = self._expr(e.a), self._expr(e.b)
        operand = e.a.dtype
        if e.op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or"):
            return f"({a} {_C_OPS[e.op]} {b})"
        if e.op in ("max", "min"):
            return round_to(f"tcc_{e.op}({a}, {b})", e.dtype)
        if operand.is_float:
            return round_to(self._float_binary(e.op, a, b, e.b, operand), e.dtype)
        return wrap(_int_binary(e.op, a, b), e.dtype)

    def _float_binary(self, op: str, a: str, b: str, rhs: Expr, dtype: DType) -> str:
        if op in ("add", "sub", "mul", "div"):
            return f"({a} {_C_OPS[op]} {b})"
        if op == "pow":
            if isinstance(rhs, Const) and rhs.value == 2:
                return f"({a} * {a})"
            return f"{'pow' if dtype.name == 'f64' else 'powf'}({a}, {b})"
        if op == "mod":
            return f"tcc_fmod({a}, {b})"
        if op == "floordiv":
            return f"tcc_ffloordiv({a}, {b})"
        raise TccCompileError(f"internal error: float operator {op}")

    def _e_Call(self, e: Call) -> str:
        if e.fn == "philox":
            return f"tcc_philox({', '.join(self._expr(a) for a in e.args)})"
        x = self._expr(e.args[0])
        if not e.dtype.is_float:  # abs / floor / ceil of an integer
            return wrap(f"({x} < 0 ? -({x}) : {x})", e.dtype) if e.fn == "abs" else x
        f64 = e.dtype.name == "f64"
        if e.fn == "sigmoid":
            one = "1.0" if f64 else "1.0f"
            text = f"({one} / ({one} + {'exp' if f64 else 'expf'}(-{x})))"
        else:
            name = _MATH_F32[e.fn]
            text = f"{name[:-1] if f64 else name}({x})"
        return round_to(text, e.dtype)


def _same_memory(e: Expr, dst: Buffer, buffers: dict[str, Buffer]) -> bool:
    """Whether ``e`` loads a 16- or 8-bit float from memory that ``dst`` stores in the same format."""
    return (isinstance(e, Load) and dst.dtype.name in NARROW and e.dtype == dst.dtype
            and buffers[e.buffer].scope != "local" and buffers[e.buffer].dtype == dst.dtype)


def _rounded_f32(e: Expr, dst: Buffer) -> bool:
    """Whether ``e`` rounds an f32 to ``dst``'s 16-bit float format: the conversion into memory
    rounds the same way, so the value's own rounding is left out (two conversions fewer)."""
    return isinstance(e, Cast) and e.dtype == dst.dtype and dst.dtype.name in ("f16", "bf16") \
        and e.a.dtype == dtypes.f32


def _int_binary(op: str, a: str, b: str) -> str:
    if op in ("add", "sub", "mul"):
        return f"({a} {_C_OPS[op]} {b})"
    if op in ("floordiv", "mod"):
        return f"tcc_{op}({a}, {b})"
    if op == "pow":
        return f"tcc_ipow({a}, {b})"
    if op == "div":
        raise TccCompileError("internal error: integer '/' reached codegen")
    raise TccCompileError(f"internal error: integer operator {op}")


def _shape_symbols(buffers: dict[str, Buffer], used: set[str]) -> set[str]:
    """The dynamic shape symbols in the dims of the ``used`` buffers: their strides read them."""
    return {n for name in used if name in buffers for d in buffers[name].shape if not isinstance(d, int)
            for n in free_vars(d)}


def _static(buf: Buffer) -> Buffer:
    """``buf``, which a kernel declares: its size must be a constant (a schedule's tile)."""
    if not buf.static:
        raise TccCompileError(f"internal error: {buf.scope} buffer {buf.name} has a dynamic shape {buf.shape}",
                              hint="GPU schedules size shared and register buffers by constant tiles")
    return buf


def _const_extent(f: For) -> int:
    value = evaluate_int(f.extent)
    if value is None:
        raise TccCompileError(f"internal error: {f.kind} loop {f.var.name} needs a constant extent", f.span)
    return value
