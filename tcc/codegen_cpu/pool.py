"""tcc's own thread pool, which the parallel loops of CPU kernels run on: ``tcc_parallel``.

Why a pool of its own rather than libgomp's: a ``GOMP_parallel`` returns only when every thread
of its team has run the region, a worker that the OS has not yet scheduled included. On a shared
machine whose other core is busy, each fork of a small kernel then waited for a time slice:
GPT-2 and T5 of hidden 128 ran 4-5x slower (4.6 ms against 0.9 ms quiet, onnxruntime 1.1 ms
either way). onnxruntime's pool lets the calling thread run the work that no worker has taken.
So does this one: the caller posts a job, runs chunks of it itself (the loop body takes them
from a shared counter, :mod:`.llvm_loops`), then waits only for the workers that joined the
job before it closed; a worker that wakes later finds the job closed and leaves it alone.

The pool is LLVM IR too (built here once per process, in an engine of its own), its workers
OS threads started with ``pthread_create`` through ctypes. Protocol, all atomics sequentially
consistent: the caller writes the job (function, context, team), stores ``closed = 0``, bumps
``generation`` and wakes sleeping workers (futex); it runs the body, stores ``closed = 1`` and
waits for ``active == 0``. A worker that sees a new generation adds itself to ``active`` and
then reads ``closed``: either the caller's later wait sees it, or it sees the job closed. A job
cannot change while a worker is active in it, since its caller waits for that worker. One job at
a time (``busy``): a call from a second thread while one runs (or a parallel loop in a parallel
loop) runs serially on its own thread. After ``os.fork`` the child has no workers: its calls run
on the calling thread until :func:`ensure_workers` starts new ones (it does so at once).

A worker can still stall the caller once it has joined: the OS may preempt it in its chunk. When
the caller waited for joined workers longer than its own run took, the calls after it run on the
caller alone for a back-off (1 ms, doubling to 64 ms while it goes on): under a load of 13 on 2
cores an elementwise loop on 2 threads took 7-30x its serial time, with the back-off 1.1-1.6x.

Workers spin ``SPIN_COUNT`` pauses after a job (tens of microseconds: the gap to the next
kernel of a model's call), then sleep on the futex, so that they do not hold a core that
another process needs. Linux only (futex); elsewhere parallel loops run serially.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from tcc import threads

SYMBOL = "tcc_parallel"  # void tcc_parallel(void (*body)(ptr ctx, i64 team), ptr ctx, i32 requested)
SPIN_COUNT = 3000  # pauses a worker spins before it sleeps: ~30-60 us on a 2-vCPU Zen 4 VM
YIELD_AFTER = 2000  # pauses the caller spins for a joined worker before yielding its core
SLACK_NS = 20_000  # a wait for joined workers beyond the caller's own run and this: one was preempted
BACKOFF_NS = (1_000_000, 64_000_000)  # serial calls after such a wait: the first back-off, the longest
_FUTEX = {"x86_64": 202, "aarch64": 98}  # SYS_futex
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129  # FUTEX_*_PRIVATE

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType(I8)
BODY = ir.FunctionType(ir.VoidType(), [PTR, I64])
STATE = ("generation", "closed", "active", "sleepers", "busy", "workers", "default_team", "team")


class _Pool:
    """The compiled pool (its engine kept alive), its state cells and the workers started."""

    def __init__(self, engine: llvm.ExecutionEngine):
        self.engine = engine
        self.cells = {name: ctypes.c_int32.from_address(engine.get_global_value_address(f"tcc_pool_{name}"))
                      for name in STATE if name != "team"}
        self.worker = engine.get_function_address("tcc_pool_worker")
        self.lock = threading.Lock()

    def start_workers(self, count: int) -> None:
        """Start workers until there are ``count`` (never fewer than there are)."""
        libc = ctypes.CDLL(None)
        with self.lock:
            for index in range(self.cells["workers"].value, count):
                handle = ctypes.c_ulong()
                if libc.pthread_create(ctypes.byref(handle), None, ctypes.c_void_p(self.worker),
                                       ctypes.c_void_p(index)) != 0:
                    return  # no more threads to be had: the loops run on those there are
                libc.pthread_detach(handle)
                self.cells["workers"].value = index + 1


LLVM_LOCK = threading.RLock()  # LLVM's global context is not thread-safe: one user at a time (jit too)


@functools.cache
def pool() -> _Pool | None:
    """The process's pool, built on first use; None where it cannot run (not Linux on x86-64 or
    AArch64): parallel loops then run serially, slower, never wrong."""
    with LLVM_LOCK:
        return _build()


@functools.cache
def _build() -> _Pool | None:
    futex = _FUTEX.get(platform.machine()) if sys.platform.startswith("linux") else None
    if futex is None:
        return None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(str(_module(futex, platform.machine() == "x86_64")))
    machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    built = _Pool(engine)
    built.cells["default_team"].value = threads.environment_default()
    llvm.add_symbol(SYMBOL, engine.get_function_address(SYMBOL))
    llvm.add_symbol(threads.SYMBOL, threads.address())  # the team size kernels read before each loop
    os.register_at_fork(after_in_child=_after_fork)
    built.start_workers((threads.requested_threads() or threads.environment_default()) - 1)
    return built


def available() -> bool:
    """Whether parallel loops can run on the pool (building it on the first call)."""
    return pool() is not None


def ensure_workers(team: int | None = None) -> None:
    """Workers enough for a team of ``team`` threads (the requested count, else the default)."""
    built = pool()
    if built is not None:
        built.start_workers((team or built.cells["default_team"].value) - 1)


def default_team() -> int:
    """The team of a parallel loop when :func:`tcc.set_num_threads` asked for none."""
    built = pool()
    return built.cells["default_team"].value if built is not None else 1


def _after_fork() -> None:
    """The child inherits the pool's cells but none of its threads: start them anew."""
    built = pool()
    built.lock = threading.Lock()
    for name in ("active", "sleepers", "busy", "closed", "workers"):
        built.cells[name].value = 0
    ensure_workers(threads.requested_threads())


threads.use_pool(default_team, ensure_workers)


def _module(futex: int, x86: bool) -> ir.Module:
    module = ir.Module("tcc_pool")
    module.triple = llvm.get_process_triple()
    cells = {}
    for name in STATE:
        cells[name] = ir.GlobalVariable(module, I32, f"tcc_pool_{name}")
        cells[name].initializer = ir.Constant(I32, 0)
    for name in ("fn", "ctx"):
        cells[name] = ir.GlobalVariable(module, PTR, f"tcc_pool_{name}")
        cells[name].initializer = ir.Constant(PTR, None)
    for name in ("backoff", "backoff_until"):  # nanoseconds
        cells[name] = ir.GlobalVariable(module, I64, f"tcc_pool_{name}")
        cells[name].initializer = ir.Constant(I64, 0)
        cells[name].align = 8
    emit = _Emitter(module, cells, futex, x86)
    emit.parallel()
    emit.worker()
    return module


class _Emitter:
    """The pool's two functions in LLVM IR."""

    def __init__(self, module: ir.Module, cells: dict[str, ir.GlobalVariable], futex: int, x86: bool):
        self.module, self.cells, self.futex, self.x86 = module, cells, futex, x86
        self.syscall = ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        self.sched_yield = ir.Function(module, ir.FunctionType(I32, []), "sched_yield")
        self.clock = ir.Function(module, ir.FunctionType(I32, [I32, PTR]), "clock_gettime")
        self.b: ir.IRBuilder = None  # type: ignore[assignment]

    def load(self, name: str) -> ir.Value:
        return self.b.load_atomic(self.cells[name], "seq_cst", 4)

    def store(self, name: str, value: int | ir.Value) -> None:
        v = ir.Constant(I32, value) if isinstance(value, int) else value
        self.b.store_atomic(v, self.cells[name], "seq_cst", 4)

    def add(self, name: str, delta: int) -> ir.Value:
        return self.b.atomic_rmw("add", self.cells[name], ir.Constant(I32, delta), "seq_cst")

    def pause(self) -> None:
        if self.x86:
            fn = self.module.globals.get("llvm.x86.sse2.pause") or ir.Function(
                self.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            self.b.call(fn, [])

    def futex_call(self, op: int, value: ir.Value) -> None:
        word = self.b.bitcast(self.cells["generation"], PTR)
        self.b.call(self.syscall, [ir.Constant(I64, self.futex), word, ir.Constant(I32, op), value,
                                   ir.Constant(PTR, None)])

    def parallel(self) -> None:
        """``tcc_parallel(body, ctx, requested)``: a team of ``requested`` (0: the default) or of
        the workers there are plus the caller, whichever is smaller; serial where the pool is busy."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [ir.PointerType(BODY), PTR, I32]), SYMBOL)
        body, ctx, requested = fn.args
        b = self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        team = b.select(b.icmp_signed(">", requested, ir.Constant(I32, 0)), requested, self.load("default_team"))
        workers_plus_one = b.add(self.load("workers"), ir.Constant(I32, 1))
        team = b.select(b.icmp_signed("<", workers_plus_one, team), workers_plus_one, team)
        serial, post = fn.append_basic_block("serial"), fn.append_basic_block("post")
        claim, check = fn.append_basic_block("claim"), fn.append_basic_block("check")
        b.cbranch(b.icmp_signed("<=", team, ir.Constant(I32, 1)), serial, check)
        b.position_at_end(check)
        start = self.now()
        b.cbranch(b.icmp_signed("<", start, self.load64("backoff_until")), serial, claim)
        b.position_at_end(claim)
        got = b.cmpxchg(self.cells["busy"], ir.Constant(I32, 0), ir.Constant(I32, 1), "seq_cst", "seq_cst")
        b.cbranch(b.extract_value(got, 1), post, serial)
        b.position_at_end(serial)
        b.call(body, [ctx, ir.Constant(I64, 1)])
        b.ret_void()
        b.position_at_end(post)
        b.store(b.bitcast(body, PTR), self.cells["fn"])
        b.store(ctx, self.cells["ctx"])
        self.store("team", team)
        self.store("closed", 0)
        self.add("generation", 1)
        wake, run = fn.append_basic_block("wake"), fn.append_basic_block("run")
        b.cbranch(b.icmp_signed(">", self.load("sleepers"), ir.Constant(I32, 0)), wake, run)
        b.position_at_end(wake)
        self.futex_call(_FUTEX_WAKE, ir.Constant(I32, 0x7FFFFFFF))
        b.branch(run)
        b.position_at_end(run)
        b.call(body, [ctx, b.sext(team, I64)])
        ran = self.now()
        self.store("closed", 1)
        self._wait_idle(fn)
        self._back_off(b.sub(ran, start), b.sub(self.now(), ran))
        self.store("busy", 0)
        b.ret_void()

    def _back_off(self, ran: ir.Value, waited: ir.Value) -> None:
        """After a wait for joined workers longer than the caller's own run (plus ``SLACK_NS``), a
        worker was preempted in its chunk (another process holds its core): later calls run serial
        for a back-off that doubles from ``BACKOFF_NS[0]`` to ``BACKOFF_NS[1]`` while that goes on;
        a call whose workers kept up resets it."""
        b = self.b
        late = b.icmp_signed(">", waited, b.add(ran, ir.Constant(I64, SLACK_NS)))
        doubled = b.shl(self.load64("backoff"), ir.Constant(I64, 1))
        low, high = (ir.Constant(I64, v) for v in BACKOFF_NS)
        longer = b.select(b.icmp_signed("<", doubled, low), low, b.select(b.icmp_signed(">", doubled, high), high,
                                                                            doubled))
        backoff = b.select(late, longer, ir.Constant(I64, 0))
        b.store_atomic(backoff, self.cells["backoff"], "monotonic", 8)
        b.store_atomic(b.add(self.now(), backoff), self.cells["backoff_until"], "monotonic", 8)

    def load64(self, name: str) -> ir.Value:
        return self.b.load_atomic(self.cells[name], "monotonic", 8)

    def now(self) -> ir.Value:
        """CLOCK_MONOTONIC in nanoseconds (the vDSO: tens of nanoseconds)."""
        b = self.b
        spec = b.alloca(ir.ArrayType(I64, 2))
        b.call(self.clock, [ir.Constant(I32, 1), b.bitcast(spec, PTR)])
        seconds = b.load(b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        nanos = b.load(b.gep(spec, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        return b.add(b.mul(seconds, ir.Constant(I64, 1_000_000_000)), nanos)

    def _wait_idle(self, fn: ir.Function) -> None:
        """Spin until no worker is active in the job; yield the core now and then (a joined worker
        may be preempted in its chunk)."""
        b = self.b
        pre = b.block
        head, spin, done = (fn.append_basic_block(n) for n in ("wait", "spin", "idle"))
        b.branch(head)
        b.position_at_end(head)
        count = b.phi(I32)
        count.add_incoming(ir.Constant(I32, 0), pre)
        b.cbranch(b.icmp_signed("==", self.load("active"), ir.Constant(I32, 0)), done, spin)
        b.position_at_end(spin)
        self.pause()
        tired = b.icmp_signed(">=", count, ir.Constant(I32, YIELD_AFTER))
        with b.if_then(tired):
            b.call(self.sched_yield, [])
        count.add_incoming(b.add(count, ir.Constant(I32, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def worker(self) -> None:
        """``tcc_pool_worker(index)``, a thread's whole life: wait for a new generation (spin,
        then sleep), join the job if it is open and the team has room for this worker, leave."""
        fn = ir.Function(self.module, ir.FunctionType(PTR, [PTR]), "tcc_pool_worker")
        b = self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        index = b.ptrtoint(fn.args[0], I32)
        first = self.load("generation")
        entry = b.block
        wait, spin, sleep, join, run, leave = (fn.append_basic_block(n) for n in
                                               ("wait", "spin", "sleep", "join", "run", "leave"))
        b.branch(wait)
        b.position_at_end(wait)  # seen: the generation last handled; spins: pauses since then
        seen, spins = b.phi(I32), b.phi(I32)
        seen.add_incoming(first, entry)
        spins.add_incoming(ir.Constant(I32, 0), entry)
        now = self.load("generation")
        b.cbranch(b.icmp_signed("!=", now, seen), join, spin)
        b.position_at_end(spin)
        self.pause()
        more = b.add(spins, ir.Constant(I32, 1))
        seen.add_incoming(seen, spin)
        spins.add_incoming(more, spin)
        b.cbranch(b.icmp_signed("<", more, ir.Constant(I32, SPIN_COUNT)), wait, sleep)
        b.position_at_end(sleep)
        self.add("sleepers", 1)
        self.futex_call(_FUTEX_WAIT, seen)  # returns at once if the generation moved meanwhile
        self.add("sleepers", -1)
        seen.add_incoming(seen, sleep)
        spins.add_incoming(more, sleep)
        b.branch(wait)
        b.position_at_end(join)
        self.add("active", 1)
        open_ = b.icmp_signed("==", self.load("closed"), ir.Constant(I32, 0))
        room = b.icmp_signed("<", index, b.sub(self.load("team"), ir.Constant(I32, 1)))
        b.cbranch(b.and_(open_, room), run, leave)
        b.position_at_end(run)
        body = b.bitcast(b.load(self.cells["fn"]), ir.PointerType(BODY))
        b.call(body, [b.load(self.cells["ctx"]), b.sext(self.load("team"), I64)])
        b.branch(leave)
        b.position_at_end(leave)
        self.add("active", -1)
        seen.add_incoming(now, leave)
        spins.add_incoming(ir.Constant(I32, 0), leave)
        b.branch(wait)
