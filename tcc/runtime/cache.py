"""The compile cache: compiled artifacts by key, in memory and on disk.

A key holds everything that changes the generated code: the compiler version, the op's
specialised TE text (which holds shapes, dtypes and parameter values), the target, the
host CPU and every codegen option. Disk entries are written to a temporary file and
renamed into place, so concurrent processes never see half an entry; each entry carries a
checksum, so a corrupt or truncated one is treated as a miss and recompiled. The entries' total
size is capped (least recently used go first: :mod:`tcc.runtime.cache_size`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from tcc.paths import cache_dir
from tcc.runtime import cache_size
from tcc.version import __version__

_MAGIC = b"TCC-CACHE-1\n"


@functools.cache
def compiler_fingerprint() -> str:
    """The compiler's version and a hash of its own source: any change to tcc is a new key.

    Hashing the source costs a few milliseconds, so the hash is kept in the disk cache under the
    files' sizes and modification times (as Python keeps bytecode) and recomputed when one changes.
    """
    root = Path(__file__).resolve().parent.parent
    files = sorted(_sources(str(root), ""))
    stamp = make_key(__version__, *(f"{relative}:{size}:{mtime}" for relative, size, mtime in files))
    disk = DiskCache(cache_dir())
    known = disk.get(stamp, ".fingerprint")
    if known is not None:
        return known.decode(errors="replace")
    h = hashlib.sha256(__version__.encode())
    for relative, _, _ in files:
        h.update(relative.encode())
        with open(os.path.join(root, relative), "rb") as f:
            h.update(f.read())
    fingerprint = f"{__version__}+{h.hexdigest()[:16]}"
    disk.put(stamp, fingerprint.encode(), ".fingerprint")
    return fingerprint


def _sources(directory: str, prefix: str) -> list[tuple[str, int, int]]:
    """(path relative to the package with ``/``, size, mtime in ns) of the compiler's source files."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir() and entry.name != "__pycache__":
                found += _sources(entry.path, f"{prefix}{entry.name}/")
            elif entry.name.endswith((".py", ".lark", ".tables")):
                info = entry.stat()
                found.append((prefix + entry.name, info.st_size, info.st_mtime_ns))
    return found


def make_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


class DiskCache:
    """Artifacts (bytes) by key, one file each."""

    def __init__(self, root: Path | None):
        self.root = root

    def _path(self, key: str, suffix: str = ".bin") -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}{suffix}"

    def get_json(self, key: str) -> dict | None:
        """A small JSON entry (the tuner's winner) beside the artifacts; None when absent or bad."""
        payload = self.get(key, ".json")
        try:
            value = json.loads(payload) if payload is not None else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def put_json(self, key: str, value: dict) -> None:
        self.put(key, json.dumps(value, sort_keys=True).encode(), ".json")

    def get(self, key: str, suffix: str = ".bin") -> bytes | None:
        if self.root is None:
            return None
        try:
            data = self._path(key, suffix).read_bytes()
        except OSError:
            return None
        header = len(_MAGIC) + 32
        if len(data) < header or not data.startswith(_MAGIC):
            return None
        digest, payload = data[len(_MAGIC):header], data[header:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        cache_size.mark_used(self._path(key, suffix))
        return payload

    def put(self, key: str, payload: bytes, suffix: str = ".bin") -> None:
        if self.root is None:
            return
        path = self._path(key, suffix)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
            cache_size.mark_used(tmp)
            os.replace(tmp, path)
            cache_size.note_written(self.root, len(payload))
        except OSError as exc:  # a read-only or full cache directory only costs a recompile next time
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            _warn_once(self.root, exc)


_warned: set[Path] = set()  # cache directories already reported unwritable


def _warn_once(root: Path, exc: OSError) -> None:
    """Say once per process and directory that entries cannot be written, and why."""
    if root in _warned:
        return
    _warned.add(root)
    warnings.warn(f"tcc: cannot write to the compile cache {root} ({exc.strerror or exc}); kernels will "
                  "be compiled again in each process (set TCC_CACHE_DIR to a writable directory, or to "
                  "'' to turn the disk cache off)", RuntimeWarning, stacklevel=3)


class MemoryCache:
    """Loaded kernels by key, for this process."""

    def __init__(self) -> None:
        self._items: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> object | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: str, value: object) -> None:
        with self._lock:
            self._items[key] = value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


MEMORY = MemoryCache()


def pack_artifact(magic: bytes, meta: Any, payload: bytes) -> bytes:
    """A backend's cache entry: its magic line, a JSON header (length, then text), then the
    payload (object code, a cubin), so that a warm start needs no IR to load it."""
    header = json.dumps(meta).encode()
    return magic + struct.pack("<I", len(header)) + header + payload


def unpack_artifact(magic: bytes, artifact: bytes) -> tuple[Any, bytes]:
    """(header, payload) of ``pack_artifact``'s bytes; ValueError when they are not such an entry."""
    if not artifact.startswith(magic):
        raise ValueError("bad magic")
    try:
        (size,) = struct.unpack_from("<I", artifact, len(magic))
    except struct.error as exc:
        raise ValueError(str(exc)) from None
    start = len(magic) + 4
    return json.loads(artifact[start:start + size]), artifact[start + size:]
