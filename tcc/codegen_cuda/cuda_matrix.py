"""The GPU's data-movement and matrix-unit statements of the loop IR, printed as inline PTX.

A mixin of the CUDA C printer (:mod:`tcc.codegen_cuda.cuda_c`): ``cp.async`` copies and their
groups, ``ldmatrix``, ``mma.sync``, ``wgmma`` with its fences and shared-memory descriptors, and
the element offsets of 128-byte swizzled shared buffers, and the call of attention's backward
(:class:`~tcc.ir.loops.MatrixSweep`). Each statement says what to emit; the
printer chooses nothing (which instruction, which layout: the schedule and tensorize did).
"""

from __future__ import annotations

from tcc.codegen_cuda.names import c_name
from tcc.errors import TccCompileError
from tcc.ir.expr import Expr, Load
from tcc.ir.loops import (
    AsyncCommit,
    AsyncCopy,
    AsyncWait,
    Buffer,
    MatrixLoad,
    Mma,
    ProxyFence,
    Stmt,
    WarpgroupMma,
    WarpgroupSync,
)
from tcc.ir.matrix_loops import MatrixSweep


class MatrixStatements:
    """Printing of the matrix-unit statements; the host class provides ``_line``, ``_flat``,
    ``_expr``, ``buffers`` (name -> Buffer) and ``fragments`` (accumulators of ``WarpgroupMma``)."""

    buffers: dict[str, Buffer]
    fragments: list[str]

    def _line(self, depth: int, text: str) -> None:
        raise NotImplementedError

    def _flat(self, buf: Buffer, indices: tuple[Expr, ...], swizzled: bool = True) -> str:
        raise NotImplementedError

    def _expr(self, e: Expr) -> str:
        raise NotImplementedError

    def _swizzled_flat(self, buf: Buffer, indices: tuple[Expr, ...], swizzled: bool) -> str:
        """The offset of an element of a 128-byte swizzled buffer (see ``Buffer``); ``swizzled=False``
        gives the canonical offset, before the exchange of chunks (what descriptors hold)."""
        rows, width = buf.shape[-2], buf.shape[-1]
        atom, chunk = buf.swizzle // buf.dtype.itemsize, 16 // buf.dtype.itemsize
        lead = self._flat(Buffer(buf.name, buf.dtype, buf.shape[:-2]), indices[:-2]) if len(indices) > 2 else "0"
        r, c = (f"(int)({self._expr(i)})" for i in indices[-2:])  # shared offsets fit in 32 bits
        within = f"({c} % {atom})" if width > atom else c
        if swizzled:
            within = f"({within} ^ (({r} & 7) * {chunk}))"
        atoms = f" + {c} / {atom} * {rows * atom}" if width > atom else ""
        return f"({lead}) * {rows * width}{atoms} + {r} * {atom} + {within}"

    def _stmt(self, s: Stmt, depth: int) -> None:
        raise NotImplementedError

    def _s_MatrixSweep(self, s: MatrixSweep, depth: int) -> None:
        """A call of ``tcc_flash_bwd`` (:mod:`tcc.codegen_cuda.flash_backward`), the statement's
        expressions and stores written as the lambdas it takes."""
        i64 = "long long"
        row, key, dot, col, value = (c_name(v.name) for v in (s.row, s.key, s.dot, s.col, s.value))
        bf16 = "true" if s.q.dtype.name == "bf16" else "false"
        aligned = "true" if s.aligned else "false"
        if s.dq is None or s.first is None:
            raise TccCompileError("internal error: a matrix sweep left unscheduled")

        def f32(e: Expr) -> str:
            return f"(float)({self._expr(e)})"
        self._line(depth, f"tcc_flash_bwd<{s.depth}, {s.block_m}, {s.warps}, {bf16}, {aligned}>("
                          f"(unsigned char*){c_name(s.shared)}, (long long)({self._expr(s.first)}), "
                          f"{s.rows}ll, {s.keys}ll, {f32(s.scale)},")
        for ref, at in ((s.q, row), (s.k, key), (s.v, key), (s.do, row)):
            self._line(depth + 1, f"[&]({i64} {at}) {{ return (const unsigned short*){self._address(ref)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}, {i64} {key}, float {dot}) -> float {{ return {f32(s.score)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}) -> {i64} {{ return ({i64})({self._expr(s.limit)}); }},")
        self._line(depth + 1, f"[&]({i64} {row}) -> float {{ return {f32(s.lse)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}) -> float {{ return {f32(s.delta)}; }},")
        self._line(depth + 1, f"[&]({i64} {row}) {{ return (float*){self._address(s.dq)}; }},")
        for out, last in ((s.dk_out, ","), (s.dv_out, ");")):
            self._line(depth + 1, f"[&]({i64} {key}, {i64} {col}, float {value}) {{")
            self._stmt(out, depth + 2)
            self._line(depth + 1, "}" + last)

    def _address(self, ref: Load) -> str:
        return f"&{c_name(ref.buffer)}[{self._flat(self.buffers[ref.buffer], ref.indices)}]"

    def _shared_address(self, ref: Load) -> str:
        """The 32-bit shared-memory address of ``ref``: the buffer's, plus the offset in 32 bits
        (so the compiler computes the offset in 32-bit arithmetic, and hoists the base)."""
        buf = self.buffers[ref.buffer]
        return (f"tcc_smem({c_name(buf.name)}) + (unsigned)({self._flat(buf, ref.indices)}) * "
                f"{buf.dtype.itemsize}u")

    def _registers(self, ref: Load, count: int) -> list[str]:
        """The ``count`` consecutive registers of a fragment starting at ``ref``."""
        first = self._flat(self.buffers[ref.buffer], ref.indices)
        return [f"{c_name(ref.buffer)}[{first} + {r}]" for r in range(count)]

    def _s_AsyncCopy(self, s: AsyncCopy, depth: int) -> None:
        src = self._address(s.src)
        cache = "cg" if s.nbytes == 16 else "ca"
        if s.valid is None:
            size = str(s.nbytes)
        else:  # a skipped copy zero-fills; its source address must still be a valid one
            valid = self._expr(s.valid)
            src = f"({valid} ? {src} : {c_name(s.src.buffer)})"
            size = f"({valid} ? {s.nbytes} : 0)"
        self._line(depth, f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], {s.nbytes}, %2;" :: '
                          f'"r"({self._shared_address(s.dst)}), "l"({src}), "r"({size}) : "memory");')

    def _s_ProxyFence(self, s: ProxyFence, depth: int) -> None:
        self._line(depth, 'asm volatile("fence.proxy.async.shared::cta;" ::: "memory");')

    def _s_WarpgroupSync(self, s: WarpgroupSync, depth: int) -> None:
        if s.op == "fence":
            self._line(depth, 'asm volatile("wgmma.fence.sync.aligned;" ::: "memory");')
        elif s.op == "commit":
            self._line(depth, 'asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");')
        else:
            self._line(depth, f'asm volatile("wgmma.wait_group.sync.aligned {s.pending};" ::: "memory");')
            for name in self.fragments:  # the accumulators are ready only now: no read moves above
                size = self.buffers[name].size
                self._line(depth, f"for (int r = 0; r < {size}; ++r) asm volatile(\"\" : \"+f\"("
                                  f"{c_name(name)}[r]) :: \"memory\");")

    def _descriptor(self, ref: Load, trans: bool) -> str:
        """The shared-memory matrix descriptor of a 128-byte swizzled tile starting at ``ref``:
        8-row groups 1024 bytes apart; a tile stored M/N-major has its 64-element atoms a whole
        atom (rows x 128 bytes) apart."""
        buf = self.buffers[ref.buffer]
        if buf.swizzle != 128:
            raise TccCompileError(f"internal error: wgmma operand {buf.name} is not 128-byte swizzled")
        lead = buf.shape[-2] * 128 if trans else 16
        address = f"&{c_name(buf.name)}[{self._flat(buf, ref.indices, swizzled=False)}]"
        return f"tcc_wgmma_desc({address}, {lead}u, 1024u)"

    def _s_WarpgroupMma(self, s: WarpgroupMma, depth: int) -> None:
        m, n, k = s.shape
        acc = self._registers(s.acc, n // 2)
        slots = ",".join(f"%{i}" for i in range(n // 2))
        da, db = self._descriptor(s.a, s.trans_a), self._descriptor(s.b, s.trans_b)
        # the transpose bits exist for 16-bit operands only (TF32 and 8-bit floats are K-major)
        trans = f", {int(s.trans_a)}, {int(s.trans_b)}" if s.kind in ("f16", "bf16") else ""
        self._line(depth, f'asm volatile("{{ .reg .pred p; setp.eq.u32 p, 1, 1; wgmma.mma_async.sync.aligned.'
                          f'm{m}n{n}k{k}.f32.{s.kind}.{s.kind} {{{slots}}}, %{n // 2}, %{n // 2 + 1}, p, 1, 1'
                          f'{trans}; }}"')
        self._line(depth + 1, ": " + ", ".join(f'"+f"({r})' for r in acc))
        self._line(depth + 1, f': "l"({da}), "l"({db}) : "memory");')

    def _s_AsyncCommit(self, s: AsyncCommit, depth: int) -> None:
        self._line(depth, 'asm volatile("cp.async.commit_group;" ::: "memory");')

    def _s_AsyncWait(self, s: AsyncWait, depth: int) -> None:
        self._line(depth, f'asm volatile("cp.async.wait_group {s.pending};" ::: "memory");')

    def _s_MatrixLoad(self, s: MatrixLoad, depth: int) -> None:
        regs = self._registers(s.dst, s.count)
        outs = ", ".join(f'"=r"({r})' for r in regs)
        slots = ",".join(f"%{i}" for i in range(s.count))
        trans = ".trans" if s.trans else ""
        self._line(depth, f'asm volatile("ldmatrix.sync.aligned.m8n8.x{s.count}{trans}.shared.b16 {{{slots}}}, '
                          f'[%{s.count}];" : {outs} : "r"({self._shared_address(s.src)}));')

    def _s_Mma(self, s: Mma, depth: int) -> None:
        m, n, k = s.shape
        acc, a, b = self._registers(s.acc, 4), self._registers(s.a, 4), self._registers(s.b, 2)
        if s.kind == "tf32":  # f32 registers, rounded to TF32 on the way in
            a, b = [f"tcc_tf32({r})" for r in a], [f"tcc_tf32({r})" for r in b]
        ab = "tf32" if s.kind == "tf32" else s.kind
        self._line(depth, f'asm volatile("mma.sync.aligned.m{m}n{n}k{k}.row.col.f32.{ab}.{ab}.f32 '
                          '{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"')
        self._line(depth + 1, ": " + ", ".join(f'"+f"({r})' for r in acc))
        self._line(depth + 1, ": " + ", ".join(f'"r"({r})' for r in a + b) + ");")

