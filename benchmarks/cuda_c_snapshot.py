"""The generated CUDA C of the examples and of benchmarks/gpu.py's workloads, to compare two
versions of tcc byte for byte (no GPU needed: only the code generator runs).

    python benchmarks/cuda_c_snapshot.py OUT_DIR           # one .cu file per kernel program
    python benchmarks/cuda_c_snapshot.py --compare A B     # which programs differ between two dumps

Run it on two checkouts (``PYTHONPATH=...``) before and after a change to the CUDA schedules:
kernels verified on a GPU should stay byte-identical unless the change means them to differ.
Each program is dumped for sm_80 (mma.sync) and sm_90 (wgmma), with tf32 where a row uses it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu import SOURCE  # benchmarks/gpu.py's ops (importing it imports torch, CPU is enough)

import tcc
from tcc.errors import TccError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_examples import CASES  # noqa: E402 - the examples' sizes, odd and round, from the tests

N = 8192
# (op, bindings, tf32) of benchmarks/gpu.py's rows
WORKLOADS = [("gemm", dict(M=4096, K=4096, N=4096), False), ("gemm", dict(M=N, K=N, N=N), False),
             ("gemm", dict(M=128, K=65536, N=128), False),  # split-K
             ("gemm", dict(M=4096, K=4096, N=4096), True), ("gemm", dict(M=N, K=N, N=N), True),
             ("hgemm", dict(M=4096, K=4096, N=4096), False), ("hgemm", dict(M=N, K=N, N=N), False),
             ("bgemm", dict(M=4096, K=4096, N=4096), False), ("bgemm", dict(M=N, K=N, N=N), False),
             ("conv", dict(N=32, C=64, H=56, W=56, F=64, KH=3, KW=3, P=1), False),
             ("hconv", dict(N=32, C=64, H=56, W=56, F=64, KH=3, KW=3, P=1), False),
             ("total", dict(M=N, N=N), False), ("chansum", dict(N=32, C=64, H=56, W=56), False),
             ("rowsum", dict(M=N, N=N), False), ("fma_relu", dict(N=1 << 26), False),
             ("softmax", dict(N=N, C=N), False), ("layernorm", dict(N=N, D=N), False)]
EXTRA_EXAMPLES = {"matmul_tc": [dict(M=128, N=128, K=64), dict(M=80, N=192, K=40)]}  # user-scheduled


def programs() -> dict[str, str]:
    """File name -> CUDA C, for every program this script covers."""
    out = {}
    for arch in ("sm_80", "sm_90"):
        for name, cases in {**CASES, **EXTRA_EXAMPLES}.items():
            try:
                op = tcc.compile(ROOT / "examples" / f"{name}.tc", target="cuda", arch=arch)[name]
            except TccError as err:  # an example this version of tcc cannot read
                print(f"skipped {name} ({arch}): {err.message}")
                continue
            for i, case in enumerate(cases):
                out[f"{arch}-example-{name}-{i}.cu"] = op.stage_text({**op.te.cparams, **case}, "cuda")
        libs = {tf32: tcc.compile(SOURCE, target="cuda", arch=arch, tf32=tf32) for tf32 in (False, True)}
        for name, sizes, tf32 in WORKLOADS:
            op = libs[tf32][name]
            label = "-".join(f"{k}{v}" for k, v in sizes.items())
            out[f"{arch}-gpu-{name}{'-tf32' if tf32 else ''}-{label}.cu"] = op.stage_text(
                {**op.te.cparams, **sizes}, "cuda")
    return out


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.glob("*.cu")} | {p.name for p in b.glob("*.cu")})
    differ = [n for n in names if not ((a / n).exists() and (b / n).exists()
                                       and (a / n).read_bytes() == (b / n).read_bytes())]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names) - len(differ)} of {len(names)} programs byte-identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="directory to write the .cu files into")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give OUT_DIR or --compare A B")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in programs().items():
        (args.out / name).write_text(text)
    print(f"wrote {len(list(args.out.glob('*.cu')))} programs to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
