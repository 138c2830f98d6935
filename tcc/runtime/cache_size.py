"""The disk cache's size: a cap with least-recently-used eviction, and what ``tcc cache info``
and ``tcc cache clear`` report and remove.

Every shape an op is called with is a kernel of its own, so a long-lived cache only grows. Each
entry's modification time is its last use (set when it is written and when a read finds it), and
a process that writes entries checks the total now and then (its first write, then after each
``cap / 16`` bytes it wrote): above the cap it removes the least recently used entries until the
total is at most ``LOW_WATER`` of the cap, so that the next few writes do not walk the directory
again. Another process that loses an entry this way only compiles it again.

The cap is ``$TCC_CACHE_MAX_SIZE`` (bytes, or a number with a ``K``, ``M``, ``G`` or ``T``
suffix, powers of 1024), default ``DEFAULT_CAP``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tcc.errors import TccArgumentError

ENV = "TCC_CACHE_MAX_SIZE"
DEFAULT_CAP = 2 << 30
LOW_WATER = 0.9  # an eviction leaves the cache at most this fraction of the cap
CHECK_EVERY = 16  # a writing process sums the cache after each cap / CHECK_EVERY bytes it wrote
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
ENTRY_DIR = re.compile(r"^[0-9a-f]{2}$")  # entries live in directories named by their key's first byte
KINDS = {".bin": "compiled kernels", ".ast": "parsed sources", ".json": "tuning results and measurements",
         ".fingerprint": "compiler fingerprints"}


def parse_size(text: str) -> int:
    """Bytes from ``2G``, ``500M``, ``64k`` or ``1048576``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise TccArgumentError(f"{ENV}={text!r} is not a size",
                               hint="give bytes, or a number with K, M, G or T (powers of 1024), e.g. 500M")
    return int(float(match.group(1)) * UNITS[match.group(2).upper()])


def cap() -> int:
    """The most bytes the disk cache's entries may take (``$TCC_CACHE_MAX_SIZE``, default 2 GiB)."""
    configured = os.environ.get(ENV)
    return DEFAULT_CAP if configured is None or not configured.strip() else parse_size(configured)


def mark_used(path: Path) -> None:
    """Record a use of the entry at ``path`` as its modification time (eviction removes the
    oldest). One clock for writes and reads: the file system's own may be coarser."""
    now = time.time_ns()
    with contextlib.suppress(OSError):  # removed meanwhile by another process: nothing to mark
        os.utime(path, ns=(now, now))


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    used: int  # the last use, ns


def entries(root: Path) -> list[Entry]:
    """The cache's entries (not the files being written, nor anything else in the directory)."""
    found = []
    with contextlib.suppress(OSError), os.scandir(root) as top:
        for folder in top:
            if not (ENTRY_DIR.match(folder.name) and folder.is_dir(follow_symlinks=False)):
                continue
            with contextlib.suppress(OSError), os.scandir(folder.path) as files:
                for f in files:
                    if f.name.startswith(".tmp-"):
                        continue
                    with contextlib.suppress(OSError):
                        info = f.stat(follow_symlinks=False)
                        found.append(Entry(Path(f.path), info.st_size, info.st_mtime_ns))
    return found


def evict(root: Path, limit: int) -> list[Entry]:
    """Remove the least recently used entries while they take more than ``limit`` bytes, down to
    ``LOW_WATER`` of it; the entries removed."""
    found = entries(root)
    total = sum(e.size for e in found)
    if total <= limit:
        return []
    removed = []
    for entry in sorted(found, key=lambda e: e.used):
        if total <= limit * LOW_WATER:
            break
        with contextlib.suppress(FileNotFoundError):  # another process removed it first
            entry.path.unlink()
        total -= entry.size
        removed.append(entry)
    return removed


@dataclass
class _Ledger:
    """Bytes this process wrote to each cache directory since it last summed it."""

    written: dict[Path, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_LEDGER = _Ledger()


def note_written(root: Path, nbytes: int) -> None:
    """Called after each write: sum the cache (and evict) on this process's first write to
    ``root`` and after each ``cap / CHECK_EVERY`` bytes written since."""
    limit = cap()
    with _LEDGER.lock:
        first = root not in _LEDGER.written
        written = _LEDGER.written[root] = _LEDGER.written.get(root, 0) + nbytes
        due = first or written >= limit // CHECK_EVERY
        if due:
            _LEDGER.written[root] = 0
    if due:
        with contextlib.suppress(OSError):
            evict(root, limit)


# ---------------------------------------------------------------- tcc cache info | clear

@dataclass(frozen=True)
class Usage:
    """What the cache directory holds: entries by kind (count, bytes), and tcc's other files."""

    entries: dict[str, tuple[int, int]]
    others: dict[str, int]  # description -> bytes

    @property
    def entry_bytes(self) -> int:
        return sum(size for _, size in self.entries.values())


def usage(root: Path) -> Usage:
    by_kind: dict[str, tuple[int, int]] = {}
    for entry in entries(root):
        kind = KINDS.get(entry.path.suffix, "other entries")
        count, size = by_kind.get(kind, (0, 0))
        by_kind[kind] = (count + 1, size + entry.size)
    others = {what: sum(_size(p) for p in paths) for what, paths in _other_files(root).items()}
    return Usage(by_kind, {what: size for what, size in others.items() if size})


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(_size(p) for p in path.iterdir())
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _other_files(root: Path) -> dict[str, list[Path]]:
    """tcc's files beside the entries: the PyTorch extension's builds, lark's parser tables, and
    entries left half-written by a process that died."""
    return {"PyTorch extension builds (torch_native/)": [root / "torch_native"],
            "parser tables (grammar-*.lark-cache)": sorted(root.glob("grammar-*.lark-cache")),
            "unfinished writes (.tmp-*)": sorted(p for p in root.glob("*/.tmp-*") if ENTRY_DIR.match(p.parent.name))}


def _remove(path: Path) -> tuple[int, int]:
    """Remove a file or a directory tree; (files, bytes) removed (none when it is gone already)."""
    if path.is_dir() and not path.is_symlink():
        files = [p for p in path.rglob("*") if not p.is_dir() or p.is_symlink()]
        removed = [_remove(p) for p in files]
        shutil.rmtree(path, ignore_errors=True)
        return sum(n for n, _ in removed), sum(b for _, b in removed)
    try:
        size = path.lstat().st_size
        path.unlink()
    except OSError:
        return 0, 0
    return 1, size


def clear(root: Path) -> tuple[int, int]:
    """Remove every file tcc keeps in ``root`` (and nothing else); (files, bytes) removed."""
    paths = [e.path for e in entries(root)] + [p for group in _other_files(root).values() for p in group]
    removed = [_remove(p) for p in paths]
    with contextlib.suppress(OSError), os.scandir(root) as top:
        for folder in top:
            if ENTRY_DIR.match(folder.name) and folder.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(folder.path)  # empty now, unless another process wrote meanwhile
    return sum(n for n, _ in removed), sum(b for _, b in removed)


def format_bytes(n: int) -> str:
    """``1.5 MiB``: a size for people."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def report(root: Path) -> str:
    """``tcc cache info``: where the cache is, what it holds by kind, and its cap."""
    found = usage(root)
    lines = [f"cache: {root}",
             f"entries: {format_bytes(found.entry_bytes)} of at most {format_bytes(cap())} ({ENV}); "
             "the least recently used go first"]
    for kind, (count, size) in sorted(found.entries.items()):
        lines.append(f"  {kind}: {count} ({format_bytes(size)})")
    for what, size in found.others.items():
        lines.append(f"other files: {what}: {format_bytes(size)}")
    return "\n".join(lines)
