"""Cold and warm (disk cache) compile time of matmul and conv2d, each in a fresh process.

Each measurement is one new Python process that imports tcc, then times ``tcc.compile`` plus
the first call, minus the median of later calls (so the kernel's own run time is not counted).
Cold: an empty cache directory. Warm: the directory a cold run filled. Medians of --runs.

    python benchmarks/compile_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import tcc
import tcc.runtime.cpu  # the backend's import (llvmlite) is counted as import, not compile
t1 = time.perf_counter()
name, path, shapes, cparams = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
t2 = time.perf_counter()
lib = tcc.compile(path)
getattr(lib, name)(*args, **cparams)
t3 = time.perf_counter()
runs = []
for _ in range(5):
    s = time.perf_counter(); getattr(lib, name)(*args, **cparams); runs.append(time.perf_counter() - s)
runs.sort()
print(json.dumps({"import": t1 - t0, "compile": (t3 - t2) - runs[2]}))
"""

CASES = {
    "matmul 256": ("matmul", "examples/matmul.tc", [[256, 256], [256, 256]], {}),
    "conv2d 3x3 64->64 56x56": ("conv2d", "examples/conv2d.tc", [[1, 64, 56, 56], [64, 64, 3, 3], [64]], {"P": 1}),
}


def measure(case: tuple, cache_dir: str) -> dict:
    name, path, shapes, cparams = case
    env = {**os.environ, "TCC_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, name, str(ROOT / path), json.dumps(shapes),
                          json.dumps(cparams)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"medians of {args.runs} fresh processes\n")
    print("| op | cold ms | warm ms | import ms |\n|---|---:|---:|---:|")
    for label, case in CASES.items():
        cold, warm, imports = [], [], []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as d:
                c = measure(case, d)
                w = measure(case, d)
            cold.append(c["compile"])
            warm.append(w["compile"])
            imports.append(w["import"])
        print(f"| {label} | {statistics.median(cold) * 1e3:.1f} | {statistics.median(warm) * 1e3:.1f} | "
              f"{statistics.median(imports) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
