"""The host time of a packed training step (issue 50), on the GPU: the offsets' ranges made by
``torch.stack`` (the code before this probe) against copies of (start, end) views, the training
step (forward + ``torch.autograd.grad`` on a fresh graph) and a no-grad forward, µs a call with no
synchronisation in the loop; then torch.profiler's view of ten steps (the code as it is).

    source .devtk/setup.sh && python3 docs/records/probes/packed_ranges_host.py
"""
import time

import torch

import tiledattention as ta
from tiledattention.entry_points import _varlen
g = torch.Generator().manual_seed(50)
lengths = [int(torch.randint(30, 513, (1,), generator=g)) for _ in range(64)]
q = torch.randn(sum(lengths), 12, 64, device="cuda", dtype=torch.bfloat16)
do = torch.randn_like(q)
cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
L = max(lengths)
leaves = [torch.randn_like(q).requires_grad_() for _ in range(3)]
def step():
    o = ta.varlen_attn(*leaves, cu, cu, L, L)
    torch.autograd.grad(o, leaves, do)
def host(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    e = time.perf_counter(); torch.cuda.synchronize()
    return (e - s) / n * 1e6
orig = _varlen.packed_ranges


def stack(cq, ck):  # the ranges as made before this probe
    return torch.stack((cq[:-1], cq[1:], ck[:-1], ck[1:])).to(torch.int32).contiguous()
def two_copies(cq, ck):
    n = cq.shape[0] - 1
    out = torch.empty((4, n), dtype=torch.int32, device=cq.device)
    out[0:2] = cq.unfold(0, 2, 1).t()
    out[2:4] = ck.unfold(0, 2, 1).t()
    return out
def one_copy(cq, ck):
    if cq is not ck:
        return two_copies(cq, ck)
    n = cq.shape[0] - 1
    out = torch.empty((4, n), dtype=torch.int32, device=cq.device)
    out.view(2, 2, n).copy_(cq.unfold(0, 2, 1).t().expand(2, 2, n))
    return out
ref = orig(cu, cu)
for name, f in (("stack", stack), ("two copies", two_copies), ("one copy", one_copy),
                ("stack again", stack)):
    assert torch.equal(f(cu, cu), ref), name
    _varlen.packed_ranges = f
    print(f"{name:12s} train step {host(step):.1f} us/call; fwd no-grad {host(lambda: ta.varlen_attn(q, q, q, cu, cu, L, L)):.1f}")
_varlen.packed_ranges = orig
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(10): step()
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
