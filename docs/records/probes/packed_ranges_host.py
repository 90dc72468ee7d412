"""The host time of a training step (issues 47 and 50), on the GPU, µs a call (the host clock
of the calls enqueued without a synchronisation, and with the final one). Two parts:

- ``ranges``: the packed encoder batch of ``packed_batches`` (64 sequences of 30-512 tokens,
  H 12, D 64, bf16), its offsets' ranges made by ``torch.stack`` (the code before this probe)
  against copies of (start, end) views: a training step (forward + ``torch.autograd.grad`` on a
  fresh graph) and a no-grad forward; then torch.profiler's view of ten steps (the code as it is);
- ``threads``: a packed step, a dense step of ours and of torch's cuDNN backend (B8 H16 S577 D64)
  and our dense no-grad forward, as they are, with autograd's worker threads off, and with a
  1 µs GIL switch interval.

    source .devtk/setup.sh && python3 docs/records/probes/packed_ranges_host.py [ranges|threads]
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.entry_points import _varlen


def host(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    return (enqueued - start) / n * 1e6, (time.perf_counter() - start) / n * 1e6


def encoder_batch():
    """``(q, do, cu, longest, leaves)`` of the packed encoder batch."""
    g = torch.Generator().manual_seed(50)
    lengths = [int(torch.randint(30, 513, (1,), generator=g)) for _ in range(64)]
    q = torch.randn(sum(lengths), 12, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    leaves = [torch.randn_like(q).requires_grad_() for _ in range(3)]
    return q, torch.randn_like(q), cu, max(lengths), leaves


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


def ranges():
    from torch.profiler import ProfilerActivity, profile

    q, do, cu, longest, leaves = encoder_batch()

    def step():
        out = ta.varlen_attn(*leaves, cu, cu, longest, longest)
        torch.autograd.grad(out, leaves, do)
    kept = _varlen.packed_ranges
    want = stack(cu, cu)
    for name, make in (("stack", stack), ("two copies", two_copies), ("one copy", one_copy),
                       ("stack again", stack)):
        assert torch.equal(make(cu, cu), want), name
        _varlen.packed_ranges = make
        print(f"{name:12s} train step {host(step, 30)[0]:.1f} us/call; fwd no-grad "
              f"{host(lambda: ta.varlen_attn(q, q, q, cu, cu, longest, longest), 30)[0]:.1f}")
    _varlen.packed_ranges = kept
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def threads():
    _, do, cu, longest, leaves = encoder_batch()
    dense = [torch.randn(8, 16, 577, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
             for _ in range(3)]
    dense_do = torch.randn_like(dense[0])

    def packed_step():
        torch.autograd.grad(ta.varlen_attn(*leaves, cu, cu, longest, longest), leaves, do)

    def dense_step():
        torch.autograd.grad(ta.sdpa(*dense), dense, dense_do)

    def cudnn_step():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(*dense)
        torch.autograd.grad(out, dense, dense_do)

    def dense_forward():
        with torch.no_grad():
            ta.sdpa(*dense)

    def report(tag):
        for name, fn in (("varlen fwd+bwd", packed_step),
                         ("ours dense B8H16S577 fwd+bwd", dense_step),
                         ("cudnn dense fwd+bwd", cudnn_step), ("ours dense fwd only", dense_forward)):
            print(f"{tag:28s} {name:32s} host/wall us: %.1f %.1f" % host(fn))
    report("default")
    torch.autograd.set_multithreading_enabled(False)
    report("no autograd threads")
    torch.autograd.set_multithreading_enabled(True)
    sys.setswitchinterval(1e-6)
    report("switchinterval 1us")


if __name__ == "__main__":
    for part in sys.argv[1:] or ["ranges", "threads"]:
        {"ranges": ranges, "threads": threads}[part]()
