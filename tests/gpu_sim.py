"""A slow CPU simulator of scheduled CUDA loop IR, for checking tensor-core kernels numerically
on machines without a GPU (CI). It runs what the CUDA C printer prints, statement by statement:
blocks one after another; the threads of a ``thread.x`` loop as Python generators advanced in
lockstep to each ``barrier`` and to each warp-wide statement (``ldmatrix``, ``mma.sync``,
``wgmma``), which it then carries out for the 32 lanes of every warp (128 of a warpgroup) as the
PTX manual lays out the fragments (``wgmma`` at once: its fences and waits order nothing here);
``cp.async`` copies land when a ``cp.async.wait_group`` lets them, so a missing wait reads stale
shared memory as a GPU may. Global and shared memory are NumPy arrays; a thread's local buffers
are its own. Small problems only (a 128 x 128 x 64 GEMM takes seconds). Statements it does not
know (block-wide all-reductions) raise NotImplementedError. Lockstep is stronger ordering than a
GPU gives: a barrier missing right before a warp-wide statement goes unnoticed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from tcc import dtypes
from tcc.ir import philox
from tcc.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Unary, Var
from tcc.ir.loops import (
    Allocate,
    AsyncCommit,
    AsyncCopy,
    AsyncWait,
    Barrier,
    BlockScan,
    Buffer,
    For,
    If,
    Let,
    LoopFunc,
    MatrixLoad,
    Mma,
    ProxyFence,
    Seq,
    Stmt,
    Store,
    WarpgroupMma,
    WarpgroupSync,
    walk_stmts,
)
from tcc.reference import _MATH

_NP = {"f16": np.float16, "bf16": np.float32, "f32": np.float32, "f64": np.float64, "i8": np.int8,
       "i32": np.int32, "i64": np.int64, "bool": np.bool_, "f8e4m3": np.float32, "f8e5m2": np.float32}
_FP8 = {"e4m3": dtypes.f8e4m3, "e5m2": dtypes.f8e5m2, "f8e4m3": dtypes.f8e4m3, "f8e5m2": dtypes.f8e5m2}
_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "div": lambda a, b: a / b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
           "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b,
           "ne": lambda a, b: a != b, "and": lambda a, b: a and b, "or": lambda a, b: a or b,
           "max": max, "min": min, "floordiv": lambda a, b: a // b if b else 0,
           "mod": lambda a, b: a % b if b else 0, "pow": lambda a, b: a ** b}


def run(func: LoopFunc, arrays: dict[str, np.ndarray], aligned: bool = True, scalars: dict | None = None) -> None:
    """Run the scheduled ``func`` on ``arrays`` (its buffer parameters by name, updated in place)
    and its runtime ``scalars``; of a kernel and its fallback, the first (``aligned``) or the second."""
    memory = {name: a.reshape(-1) for name, a in arrays.items()}
    buffers = {p.name: p for p in func.params if isinstance(p, Buffer)}
    body = func.body
    while isinstance(body, Allocate):  # the function's global intermediates (dynamic shapes: of ``scalars``)
        buffers[body.buffer.name] = body.buffer
        size = math.prod(_int(d, scalars or {}) if not isinstance(d, int) else d for d in body.buffer.shape)
        memory[body.buffer.name] = np.zeros(size, _NP[body.buffer.dtype.name])
        body = body.body
    kernels = list(body.stmts) if isinstance(body, Seq) else [body]
    skip = False
    for kernel in kernels:
        assert isinstance(kernel, For) and kernel.kind == "block.x"
        variant = any(k == "aligned" for k, _ in kernel.annotations)
        requires = next((v for k, v in kernel.annotations if k == "requires"), None)  # (of the shape symbols)
        if requires is not None and not _int(requires, scalars or {}):
            continue  # its fallback, next, runs
        if skip or (variant and not aligned):
            skip = False
            continue
        skip = variant
        for b in range(_int(kernel.extent, scalars or {})):
            _Block(buffers, memory).run(kernel.body, {**(scalars or {}), kernel.var.name: b})


def _int(e: Expr, env: dict) -> int:
    return int(_Eval(env, {}, {}).expr(e))


class _Eval:
    """Expressions of one thread: ``env`` its variables, ``memory`` what it sees (global, shared
    and its local buffers), ``buffers`` their shapes."""

    def __init__(self, env: dict, memory: dict, buffers: dict):
        self.env, self.memory, self.buffers = env, memory, buffers

    def expr(self, e: Expr):
        if isinstance(e, Const):
            return _NP[e.dtype.name](e.value) if e.dtype.is_float else int(e.value)
        if isinstance(e, Var):
            return self.env[e.name]
        if isinstance(e, Load):
            return self.memory[e.buffer][self.offset(e)]
        if isinstance(e, Binary):
            value = _BINARY[e.op](self.expr(e.a), self.expr(e.b))
            return _NP[e.dtype.name](value) if e.dtype.is_float else value
        if isinstance(e, Cast):
            value = self.expr(e.a)
            if e.dtype.is_fp8:  # (8-bit floats held as float32, rounded as the conversion does)
                return np.float32(dtypes.round_fp8(value, e.dtype))
            return _NP[e.dtype.name](value) if e.dtype.is_float or e.dtype.name == "bool" else int(value)
        if isinstance(e, Select):
            return self.expr(e.a) if self.expr(e.cond) else self.expr(e.b)
        if isinstance(e, Unary):
            return -self.expr(e.a) if e.op == "neg" else not self.expr(e.a)
        if isinstance(e, Call) and e.fn == "philox":
            seed, *counter = (self.expr(a) for a in e.args[1:])
            return int(philox.word(int(e.args[0].value), seed, tuple(counter)))
        if isinstance(e, Call) and e.fn in _MATH and len(e.args) == 1:  # (math functions, as the reference has them)
            return _NP[e.dtype.name](_MATH[e.fn](np.float64(self.expr(e.args[0]))))
        raise NotImplementedError(f"simulating {type(e).__name__}")

    def offset(self, ref: Load) -> int:
        """The row-major element offset of ``ref`` (logical indices: swizzling is a layout only)."""
        shape = self.buffers[ref.buffer].shape
        flat = 0
        for index, dim in zip(ref.indices, shape):  # (a dynamic dim: of the shape symbols in ``env``)
            flat = flat * (dim if isinstance(dim, int) else int(self.expr(dim))) + int(self.expr(index))
        return flat


class _Block:
    """One block: its shared memory, and the statements outside its thread loops (run once)."""

    def __init__(self, buffers: dict[str, Buffer], memory: dict[str, np.ndarray]):
        self.buffers, self.memory = dict(buffers), dict(memory)
        self.locals: dict[str, np.ndarray] = {}  # local buffers allocated outside the thread loops
        # each thread's own copy of such a buffer that its thread loops store to (a row's values
        # kept in registers across loops: tcc/passes/autoschedule_cuda/row_registers.py)
        self.per_thread: dict[int, dict[str, np.ndarray]] = {}

    def run(self, s: Stmt, env: dict) -> None:
        ev = _Eval(env, {**self.memory, **self.locals}, self.buffers)
        if isinstance(s, Seq):
            for c in s.stmts:
                self.run(c, env)
        elif isinstance(s, Allocate):
            self.buffers[s.buffer.name] = s.buffer
            store = self.memory if s.buffer.scope == "shared" else self.locals
            store[s.buffer.name] = np.full(s.buffer.size, np.nan if s.buffer.dtype.is_float else 0,
                                           _NP[s.buffer.dtype.name])
            self.run(s.body, env)
        elif isinstance(s, Let):
            self.run(s.body, {**env, s.var.name: ev.expr(s.value)})
        elif isinstance(s, For) and s.kind == "thread.x":
            self._threads(s, env)
        elif isinstance(s, For):
            for i in range(_int(s.extent, env)):
                self.run(s.body, {**env, s.var.name: i})
        elif isinstance(s, If):
            branch = s.then if ev.expr(s.cond) else s.otherwise
            if branch is not None:
                self.run(branch, env)
        elif isinstance(s, Store):  # (all threads store the same value: a reduction's start)
            for own in self.per_thread.values():
                own.pop(s.buffer, None)
            target = self.locals.get(s.buffer)
            target = self.memory[s.buffer] if target is None else target
            target[ev.offset(Load(s.buffer, s.indices, s.value.dtype))] = ev.expr(s.value)
        elif not isinstance(s, Barrier):  # (between two thread loops, each of which has run to its end)
            raise NotImplementedError(f"simulating {type(s).__name__} outside the thread loops")

    def _threads(self, loop: For, env: dict) -> None:
        """The loop's threads in lockstep, from one barrier or warp-wide statement to the next."""
        threads = [_Thread(self, {**env, loop.var.name: t}, self.per_thread.get(t, {}))
                   for t in range(_int(loop.extent, env))]
        runs = [th.run(loop.body) for th in threads]
        while True:
            events = [next(r, None) for r in runs]
            if all(e is None for e in events):
                break
            kinds = {type(e[0]).__name__ if e is not None else "end" for e in events}
            assert len(kinds) == 1, f"threads diverge at a block-wide point: {kinds}"
            if isinstance(events[0][0], Barrier):  # (copies in flight stay so: the schedule waits first)
                continue
            if isinstance(events[0][0], BlockScan):
                _block_scan(events[0][0], threads, events[0][1])
                continue
            size = 128 if isinstance(events[0][0], WarpgroupMma) else 32
            for w in range(0, len(threads), size):
                _warp_statement(events[w:w + size], threads[w:w + size])
        reduced = set()
        for key, value in loop.annotations:  # ``allreduce=ACC:OP``: every thread's ACC combined
            if key == "allreduce":
                acc, op = str(value).split(":")
                reduced.add(acc)
                total = threads[0].locals[acc][0]
                for th in threads[1:]:
                    total = _BINARY[op](total, th.locals[acc][0])
                self.locals[acc][0] = total
        kept = {s.buffer for s in walk_stmts(loop.body) if isinstance(s, Store) and s.buffer in self.locals} - reduced
        for t, th in enumerate(threads):
            self.per_thread.setdefault(t, {}).update({name: th.locals[name] for name in kept})


def _block_scan(s: BlockScan, threads: list, ev: _Eval) -> None:
    """Each thread's ``buffer[0]``: the combination of the earlier threads' (in thread order);
    ``buffer[1]``: of all of them."""
    total = ev.expr(s.identity)
    for th in threads:
        value = th.locals[s.buffer][0]
        th.locals[s.buffer][0] = total
        total = _BINARY[s.op](total, value)
    for th in threads:
        th.locals[s.buffer][1] = total


class _Thread:
    def __init__(self, block: _Block, env: dict, own: dict[str, np.ndarray]):
        self.block = block
        self.env = env
        self.locals = {name: a.copy() for name, a in {**block.locals, **own}.items()}
        self.buffers = dict(block.buffers)
        self.groups: list[list[tuple[str, int, np.ndarray]]] = [[]]  # cp.async groups, last one open

    def eval(self, env: dict) -> _Eval:
        return _Eval(env, {**self.block.memory, **self.locals}, self.buffers)

    def run(self, s: Stmt, env: dict | None = None) -> Iterator:
        env = self.env if env is None else env
        ev = self.eval(env)
        if isinstance(s, Seq):
            for c in s.stmts:
                yield from self.run(c, env)
        elif isinstance(s, Let):
            yield from self.run(s.body, {**env, s.var.name: ev.expr(s.value)})
        elif isinstance(s, For) and s.kind == "vector":
            self._vector(s, env)
        elif isinstance(s, For):
            assert s.kind in ("serial", "unroll"), f"simulating a {s.kind} loop inside a thread"
            for i in range(_int(s.extent, env)):
                yield from self.run(s.body, {**env, s.var.name: i})
        elif isinstance(s, If):
            branch = s.then if ev.expr(s.cond) else s.otherwise
            if branch is not None:
                yield from self.run(branch, env)
        elif isinstance(s, Allocate):
            self.buffers[s.buffer.name] = s.buffer
            fresh = np.full(s.buffer.size, np.nan if s.buffer.dtype.is_float else 0, _NP[s.buffer.dtype.name])
            if s.buffer.scope == "shared":  # one per block, whichever thread gets there first
                if s.buffer.name not in self.block.memory:
                    for name in s.reuses:  # their memory is this buffer's now: what they held is gone
                        self.block.memory[name][:] = np.nan if self.buffers[name].dtype.is_float else 0
                self.block.memory.setdefault(s.buffer.name, fresh)
            else:
                self.locals[s.buffer.name] = fresh
            yield from self.run(s.body, env)
        elif isinstance(s, Store) and s.accumulate:  # atomicAdd: its read and write are one step
            target = self.locals.get(s.buffer)
            target = self.block.memory[s.buffer] if target is None else target
            target[ev.offset(Load(s.buffer, s.indices, s.value.dtype))] += ev.expr(s.addend)
        elif isinstance(s, Store):
            target = self.locals.get(s.buffer)
            target = self.block.memory[s.buffer] if target is None else target
            target[ev.offset(Load(s.buffer, s.indices, s.value.dtype))] = ev.expr(s.value)
        elif isinstance(s, (Barrier, BlockScan, MatrixLoad, Mma, WarpgroupMma)):
            yield (s, ev)
        elif isinstance(s, (WarpgroupSync, ProxyFence)):
            pass  # wgmma runs when issued; the async proxy sees what the thread wrote
        elif isinstance(s, AsyncCopy):
            self._async_copy(s, ev)
        elif isinstance(s, AsyncCommit):
            self.groups.append([])
        elif isinstance(s, AsyncWait):
            self.land_copies(s.pending)
        else:
            raise NotImplementedError(f"simulating {type(s).__name__}")

    def _vector(self, s: For, env: dict) -> None:
        """A vector loop (one wide access on the GPU): its lanes in order, checking the schedule's
        promises: its body is lets, at most one guard and a store; every lane stores, or none; they
        store consecutive elements of one buffer, the first on a multiple of the lane count."""
        lanes = _int(s.extent, env)
        stored = []
        for i in range(lanes):
            body, lane_env = s.body, {**env, s.var.name: i}
            while isinstance(body, (Let, If)):
                if isinstance(body, If):
                    assert body.otherwise is None, "a vector loop's guard has an else"
                    if not self.eval(lane_env).expr(body.cond):
                        break
                    body = body.then
                    continue
                lane_env = {**lane_env, body.var.name: self.eval(lane_env).expr(body.value)}
                body = body.body
            if isinstance(body, If):  # guarded out
                continue
            assert isinstance(body, Store), f"a vector loop's body ends in {type(body).__name__}, not a store"
            ev = self.eval(lane_env)
            stored.append((body.buffer, ev.offset(Load(body.buffer, body.indices, body.value.dtype))))
            for _ in self.run(body, lane_env):
                raise AssertionError("a block-wide statement in a vector loop")
        if not stored:
            return
        first = stored[0][1]
        assert all(name == stored[0][0] for name, _ in stored) and first % lanes == 0 and \
            [at for _, at in stored] == list(range(first, first + lanes)), f"vector loop {s.var.name}: {stored}"

    def _async_copy(self, s: AsyncCopy, ev: _Eval) -> None:
        """Read the source now, write shared memory when a wait lets the group land."""
        count = s.nbytes // self.buffers[s.dst.buffer].dtype.itemsize
        valid = s.valid is None or ev.expr(s.valid)
        start = ev.offset(s.src) if valid else 0
        data = self.block.memory[s.src.buffer][start:start + count].copy() if valid else \
            np.zeros(count, _NP[self.buffers[s.dst.buffer].dtype.name])
        self.groups[-1].append((s.dst.buffer, ev.offset(s.dst), data))

    def land_copies(self, pending: int) -> None:
        """Complete every committed group but the newest ``pending``."""
        committed = self.groups[:-1]
        done, keep = committed[:max(0, len(committed) - pending)], committed[max(0, len(committed) - pending):]
        for group in done:
            for name, start, data in group:
                self.block.memory[name][start:start + len(data)] = data
        self.groups = keep + [self.groups[-1]]


def _registers(th: _Thread, ev: _Eval, ref: Load) -> tuple[np.ndarray, int]:
    """A lane's fragment: its local buffer and the offset of the first register."""
    return th.locals[ref.buffer], ev.offset(ref)


def _warp_statement(events: list, lanes: list[_Thread]) -> None:
    s = events[0][0]
    if isinstance(s, MatrixLoad):
        _ldmatrix(s, events, lanes)
    elif isinstance(s, WarpgroupMma):
        _wgmma(s, events, lanes)
    else:
        _mma(s, events, lanes)


def _ldmatrix(s: MatrixLoad, events: list, lanes: list[_Thread]) -> None:
    """``ldmatrix.x{count}``: lane ``8 q + r`` gives row ``r`` of tile ``q``; register ``q`` of lane
    ``l`` receives tile ``q``'s elements (row l/4, columns 2 (l%4), +1), or with ``trans`` (rows
    2 (l%4), +1 of column l/4). A row is 16 bytes: 8 16-bit elements, or 16 8-bit ones (four to a
    register, columns 4 (l%4) .. +3)."""
    kind = lanes[0].buffers[s.src.buffer].dtype.name
    per = 4 if kind in _FP8 else 2  # elements per 32-bit register
    tiles = []
    for q in range(s.count):
        rows = []
        for r in range(8):
            th, ev = lanes[8 * q + r], events[8 * q + r][1]
            start = ev.offset(s.src)
            rows.append(th.block.memory[s.src.buffer][start:start + 4 * per].astype(np.float32))
        tiles.append(np.stack(rows))
    for lane, (th, (_, ev)) in enumerate(zip(lanes, events)):
        regs, first = _registers(th, ev, s.dst)
        g, t = lane // 4, lane % 4
        for q, tile in enumerate(tiles):
            assert not (s.trans and per == 4), "ldmatrix.trans of 8-bit elements"
            pair = (tile[2 * t, g], tile[2 * t + 1, g]) if s.trans else tuple(tile[g, per * t:per * t + per])
            regs[first + q] = _pack(pair, kind)


def _pack(values, kind: str) -> int:
    """Two 16-bit values (or four 8-bit ones) in one 32-bit register, the first in the low bits."""
    if kind in _FP8:
        table = dtypes.fp8_values(_FP8[kind])
        codes = [int(np.flatnonzero(table == np.float32(v))[0]) for v in values]  # (exact values only)
        word = sum(c << (8 * i) for i, c in enumerate(codes))
        return word - (1 << 32) if word >= 1 << 31 else word
    bits = np.array(values, np.float16).view(np.uint16) if kind == "f16" else \
        (np.array(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    word = int(bits[0]) | (int(bits[1]) << 16)
    return word - (1 << 32) if word >= 1 << 31 else word  # as the i32 the fragment buffer holds


def _unpack(reg, kind: str) -> tuple[float, ...]:
    if kind in _FP8:
        return tuple(dtypes.fp8_values(_FP8[kind])[[(int(reg) >> (8 * i)) & 0xFF for i in range(4)]])
    halves = np.array([int(reg) & 0xFFFF, (int(reg) >> 16) & 0xFFFF], np.uint16)
    if kind == "f16":
        return tuple(halves.view(np.float16).astype(np.float32))
    return tuple((halves.astype(np.uint32) << 16).view(np.float32))


def _mma(s: Mma, events: list, lanes: list[_Thread]) -> None:
    """``mma.sync.m16n8k{32,16,8}``: gather the warp's A (16 x k), B (k x 8) and C (16 x 8) from the
    lanes' fragments (g = lane / 4, t = lane % 4), multiply-add, scatter D back."""
    m, n, k = s.shape
    a, b, c = np.zeros((m, k)), np.zeros((k, n)), np.zeros((m, n))
    per = {"tf32": 1, "e4m3": 4, "e5m2": 4}.get(s.kind, 2)  # elements per register
    for lane, (th, (_, ev)) in enumerate(zip(lanes, events)):
        g, t = lane // 4, lane % 4
        ra, fa = _registers(th, ev, s.a)
        rb, fb = _registers(th, ev, s.b)
        rc, fc = _registers(th, ev, s.acc)
        for r in range(4):
            row, col = g + 8 * (r % 2), per * t + k // 2 * (r // 2)
            if s.kind == "tf32":
                a[row, col] = _tf32(ra[fa + r])
            else:
                a[row, col:col + per] = _unpack(ra[fa + r], s.kind)
        for r in range(2):
            kk = per * t + k // 2 * r
            if s.kind == "tf32":
                b[kk, g] = _tf32(rb[fb + r])
            else:
                b[kk:kk + per, g] = _unpack(rb[fb + r], s.kind)
        for r in range(4):
            c[g + 8 * (r // 2), 2 * t + r % 2] = rc[fc + r]
    d = (c + a @ b).astype(np.float32)
    for lane, (th, (_, ev)) in enumerate(zip(lanes, events)):
        g, t = lane // 4, lane % 4
        rc, fc = _registers(th, ev, s.acc)
        for r in range(4):
            rc[fc + r] = d[g + 8 * (r // 2), 2 * t + r % 2]


def _tf32(x) -> float:
    """f32 rounded to TF32 (10 mantissa bits, nearest, ties away from zero: cvt.rna)."""
    bits = np.array([x], np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return float(rounded[0]) if math.isfinite(float(x)) else float(x)


def _wgmma(s: WarpgroupMma, events: list, lanes: list[_Thread]) -> None:
    """``wgmma.m64nNk``: A (64 x k) and B (k x N) straight from shared memory, named by their first
    element (logical indices; ``trans``: stored [k][row]); lane ``l`` of warp ``w`` holds rows
    ``16 w + g``, ``+ 8`` and columns ``8 j + 2 t``, ``+ 1`` of D in registers ``4 j + e``."""
    m, n, k = s.shape
    th, ev = lanes[0], events[0][1]
    memory = th.block.memory

    def tile(ref: Load, rows: int, trans: bool) -> np.ndarray:
        """The operand's ``rows x k`` tile: element (r, kk)."""
        buf = th.buffers[ref.buffer]
        lead = [int(ev.expr(i)) for i in ref.indices[:-2]]
        first = [int(ev.expr(i)) for i in ref.indices[-2:]]
        out = np.zeros((rows, k))
        for r in range(rows):
            for kk in range(k):
                at = (first[0] + kk, first[1] + r) if trans else (first[0] + r, first[1] + kk)
                flat = 0
                for index, dim in zip([*lead, *at], buf.shape):
                    flat = flat * dim + index
                value = memory[ref.buffer][flat]
                out[r, kk] = _tf32(value) if s.kind == "tf32" else float(value)
        return out
    a, b = tile(s.a, m, s.trans_a), tile(s.b, n, s.trans_b)
    c = np.zeros((m, n))
    places = []
    for lane, (th, (_, ev)) in enumerate(zip(lanes, events)):
        w, g, t = lane // 32, lane % 32 // 4, lane % 4
        rc, fc = _registers(th, ev, s.acc)
        for j in range(n // 8):
            for e in range(4):
                row, col = 16 * w + g + 8 * (e // 2), 8 * j + 2 * t + e % 2
                c[row, col] = rc[fc + 4 * j + e]
                places.append((rc, fc + 4 * j + e, row, col))
    d = (c + a @ b.T).astype(np.float32)
    for regs, r, row, col in places:
        regs[r] = d[row, col]
