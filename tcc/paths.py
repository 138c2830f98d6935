"""Where tcc keeps files: one directory for the compile cache and the parser's tables."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path | None:
    """``$TCC_CACHE_DIR``, else the user's cache directory; ``TCC_CACHE_DIR=""`` disables it."""
    configured = os.environ.get("TCC_CACHE_DIR")
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tcc"
