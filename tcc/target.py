"""The machine a kernel is compiled for, as one value passed down the pipeline.

Schedules size their work from it (a CUDA grid that fills ``sms`` multiprocessors, tiles that
fit the shared memory) instead of host look-ups and constants scattered through passes and
codegen, and its :meth:`key` is part of every cache key, so a kernel scheduled for one machine
is not reused on another. The runtime builds it: read from the device or the host where there
is one (``tcc.runtime.cuda.machine``, ``tcc.runtime.cpu.machine``), else the defaults of the
architecture asked for; a user may also give one, ``tcc.compile(src, target=CudaTarget(...))``.
The strings ``"cpu"`` and ``"cuda"`` still name the default of each kind.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields, replace
from typing import ClassVar


def _key(value: object) -> str:
    return ",".join(f"{f.name}={getattr(value, f.name)}" for f in fields(value))  # type: ignore[arg-type]


@dataclass(frozen=True)
class CpuTarget:
    """A CPU: LLVM's triple, CPU name and features, the threads to use and data cache bytes by level."""

    triple: str = ""
    isa: str = "generic"
    features: str = ""
    cores: int = 1
    caches: tuple[tuple[int, int], ...] = ((1, 32 << 10), (2, 1 << 20), (3, 8 << 20))
    kind: ClassVar[str] = "cpu"
    is_gpu: ClassVar[bool] = False
    shared_memory_per_block: ClassVar[int] = 0  # a CPU has no memory shared by a block of threads
    fp8: ClassVar[bool] = False  # no 8-bit float arithmetic: f8e4m3 and f8e5m2 are CUDA's

    def key(self) -> str:
        return f"cpu:{_key(self)}"

    @classmethod
    def of_host(cls, triple: str, isa: str, features: str) -> CpuTarget:
        """This machine: LLVM's view of its CPU (from the code generator) plus the cores this
        process may run on and the data cache sizes."""
        return cls(triple, isa, features, host_cores(), tuple(sorted(host_caches().items())))

    def cache_bytes(self, level: int) -> int:
        """The data cache of ``level`` (1, 2, 3), in bytes."""
        return dict(self.caches)[level]

    @property
    def vector_bytes(self) -> int:
        """The width of the vector registers: 64 with AVX-512F (32 of them), else 32 (AVX2: 16)."""
        return 64 if "+avx512f" in self.features.split(",") else 32

    @property
    def avx512(self) -> bool:
        """AVX-512F and DQ (``vrangeps``, ``vscalefps``, non-temporal 64-byte stores)."""
        flags = self.features.split(",")
        return "+avx512f" in flags and "+avx512dq" in flags


@dataclass(frozen=True)
class CudaTarget:
    """An NVIDIA GPU: its architecture and the resources schedules size their work from.

    Every limit a CUDA schedule obeys is a field here, read from the device by the driver where
    there is one (``tcc.codegen_cuda.driver.device_target``) and else the data-centre part of the
    architecture (:meth:`for_arch`); the defaults are an H100 SXM (sm_90). The tile builders pick
    the largest tile and pipeline depth whose shared memory and registers fit, the bind pass and
    the flat and row kernels keep to ``max_threads_per_block``, and the grids are sized for
    ``sms`` multiprocessors holding ``max_threads_per_sm`` threads each.
    """

    arch: str = "sm_90"
    sms: int = 132  # multiprocessors
    shared_per_block: int = 48 << 10  # static shared memory a block may use
    shared_per_block_optin: int = 227 << 10  # dynamic, after cuFuncSetAttribute
    shared_per_sm: int = 228 << 10
    registers_per_sm: int = 65536  # 32-bit registers of one multiprocessor
    max_threads_per_block: int = 1024
    l2_bytes: int = 50 << 20
    registers_per_block: int = 65536  # the most one block's threads may hold together
    registers_per_thread: int = 255  # the most one thread may address (the ISA's limit since sm_35)
    max_threads_per_sm: int = 2048  # threads resident on one multiprocessor at once
    kind: ClassVar[str] = "cuda"
    is_gpu: ClassVar[bool] = True

    def key(self) -> str:
        return f"cuda:{_key(self)}"

    @property
    def shared_memory_per_block(self) -> int:
        """The shared memory one block may use: the opt-in limit, since the runtime opts every
        kernel that needs more than the static part in (227 KiB on sm_90, not the static 48)."""
        return self.shared_per_block_optin

    def thread_registers(self, threads: int) -> int:
        """The registers each thread of a ``threads``-thread block may use: the ISA's per-thread
        limit, or the block's share of the register file where that is smaller."""
        return min(self.registers_per_thread, self.registers_per_block // threads)

    @property
    def half_mma(self) -> bool:
        """Whether the chip has ``mma.sync.m16n8k16`` for f16 and bf16 (Ampere, sm_80, and later)."""
        return self.capability >= (8, 0)

    @property
    def warpgroup_mma(self) -> bool:
        """Whether the chip has ``wgmma`` (Hopper: sm_90, sm_90a)."""
        return self.arch.startswith("sm_90")

    @property
    def capability(self) -> tuple[int, int]:
        """The compute capability, (major, minor): ``sm_89`` is (8, 9), ``sm_90a`` (9, 0)."""
        digits = "".join(ch for ch in self.arch.removeprefix("sm_") if ch.isdigit())
        return (int(digits[:-1] or 0), int(digits[-1:] or 0))

    @property
    def fp8(self) -> bool:
        """Whether the chip has FP8 tensor cores and conversions (``f8e4m3``, ``f8e5m2``: compute
        capability 8.9 and later: ``mma.sync ... e4m3`` on sm_89, ``wgmma`` on sm_90)."""
        return self.capability >= (8, 9)

    @classmethod
    def for_arch(cls, arch: str) -> CudaTarget:
        """The usual data-centre part of an architecture, for compiling where no GPU is read."""
        base = _CUDA_PARTS.get(arch) or _CUDA_PARTS.get(arch.rstrip("a")) or cls()
        return replace(base, arch=arch)


# the data-centre parts (V100, T4, A100, A10, L4, H100), from the CUDA programming guide's table of
# compute capabilities: multiprocessors, shared memory (static per block, opt-in per block, per
# multiprocessor), registers per multiprocessor, threads per block, L2; then registers per block
# and per thread, and resident threads per multiprocessor
_CUDA_PARTS = {
    "sm_70": CudaTarget("sm_70", 80, 48 << 10, 96 << 10, 96 << 10, 65536, 1024, 6 << 20, 65536, 255, 2048),
    "sm_75": CudaTarget("sm_75", 40, 48 << 10, 64 << 10, 64 << 10, 65536, 1024, 4 << 20, 65536, 255, 1024),
    "sm_80": CudaTarget("sm_80", 108, 48 << 10, 163 << 10, 164 << 10, 65536, 1024, 40 << 20, 65536, 255, 2048),
    "sm_86": CudaTarget("sm_86", 72, 48 << 10, 99 << 10, 100 << 10, 65536, 1024, 6 << 20, 65536, 255, 1536),
    "sm_89": CudaTarget("sm_89", 58, 48 << 10, 99 << 10, 100 << 10, 65536, 1024, 48 << 20, 65536, 255, 1536),
    "sm_90": CudaTarget(),
}


def host_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def host_caches() -> dict[int, int]:
    """Data cache sizes in bytes by level, from /sys (defaults where it is unreadable)."""
    return read_caches("/sys/devices/system/cpu/cpu0/cache")


def read_caches(root: str) -> dict[int, int]:
    """Data cache sizes from a sysfs cache directory (``index*/{type,level,size}``)."""
    sizes = dict(CpuTarget.caches)
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))  # not "uevent"
    except OSError:
        return sizes
    for entry in entries:
        path = os.path.join(root, entry)
        try:
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "level")) as f:
                level = int(f.read())
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes[level] = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
    return sizes


Target = CpuTarget | CudaTarget
