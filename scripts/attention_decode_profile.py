"""Where a decode call's time goes (device only): the op's kernels under torch.profiler, and the call timed."""
import sys, time, statistics, torch
sys.path.insert(0, "tests")
import tcc
from test_attention import ATTENTION
lib = tcc.compile(ATTENTION, target="cuda")
op = lib.attention.bound(T="f16")
B, H, L, D = 8, 16, 8192, 128
q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
k = torch.randn(B, H, L, D, device="cuda", dtype=torch.float16)
v = torch.randn(B, H, L, D, device="cuda", dtype=torch.float16)
out = torch.empty_like(q)
scale = D ** -0.5
f1 = lambda: op(q, k, v, scale, out=out)
f2 = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
f1(); f2(); torch.cuda.synchronize()
ref = f2()
print("err", (out.float() - ref.float()).abs().max().item())
for name, f in (("tcc", f1), ("sdpa", f2)):
    ts = []
    for _ in range(9):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(10): f()
        torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) / 10)
    print(name, f"{statistics.median(ts)*1e6:.1f} us a call")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10): f1()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
