"""Host time of one training call of attention, per contender: the forward (autograd graph
recorded), the backward (``torch.autograd.grad``) and the two together, each measured with no
synchronisation in the loop (the time the host spends before it may go on; the GPU queue
absorbs the kernels), against torch's cuDNN backend and FlashAttention-4 where installed.

    python scripts/training_host_time.py [--calls 200] [--repeats 5] [--profile]

Each figure is the median over ``--repeats`` rounds of ``--calls`` calls, the contenders
interleaved round by round, in microseconds per call. Before each round the GPU is drained
(``torch.cuda.synchronize``); in a round nothing synchronises, so a contender whose kernels take
longer than its host work is timed by the host alone until the launch queue fills (1024
launches: the rounds stay well under it for the small shapes; the table's ``gpu`` column is the
GPU time of a forward+backward, and a host figure at or above it says the host waited for the
GPU). Last, a
packed batch's training call (64 sequences of 64-511 tokens) through ``varlen_attn``, through
its custom op and through FlashAttention-4's ``flash_attn_varlen_func``.

``--profile``: a cProfile of our backward and forward calls on the first shape and on the
packed batch (the 25 most expensive functions by own time) before the table, which is printed
last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Callable

from _gpu import require_gpu

import torch
import torch.nn.functional as F

import tiledattention

#: (B, H_q, H_kv, S, D): the issue's three shapes, then two of ours
SHAPES = [(1, 8, 8, 256, 64), (8, 16, 16, 577, 64), (1, 32, 8, 4096, 128),
          (4, 12, 4, 1000, 96), (2, 16, 16, 2048, 128)]


def _inputs(b: int, hq: int, hkv: int, s: int, d: int):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def make(h: int) -> torch.Tensor:
        x = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x.requires_grad_()
    q, k, v = make(hq), make(hkv), make(hkv)
    return q, k, v, torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)


def _contenders(hq: int, hkv: int) -> dict[str, Callable]:
    found = {"tiledattention": lambda q, k, v: tiledattention.sdpa(q, k, v, causal=True)}

    def cudnn(q, k, v):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=hq != hkv)
    found["cudnn"] = cudnn
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # noqa: BLE001 - not installed: no such contender
        return found

    def fa4(q, k, v):  # its layout is [B, S, H, D]
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                              causal=True)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)
    found["fa4"] = fa4
    return found


def _per_call(step: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def _gpu_ms(step: Callable[[], object], calls: int = 20) -> float:
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(calls):
        step()
    last.record()
    torch.cuda.synchronize()
    return first.elapsed_time(last) / calls * 1e3  # µs per call


def _profile(fn: Callable, q, k, v, g, calls: int) -> str:
    out = fn(q, k, v)
    parts = io.StringIO()
    for what, step in (("backward", lambda: torch.autograd.grad(out, (q, k, v), g,
                                                                retain_graph=True)),
                       ("forward", lambda: fn(q, k, v))):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            step()
        profiler.disable()
        torch.cuda.synchronize()
        parts.write(f"--- our {what}, {calls} calls ---\n")
        pstats.Stats(profiler, stream=parts).sort_stats("tottime").print_stats(25)
    return parts.getvalue()


def _packed_rows(calls: int, repeats: int, profile: bool) -> list[tuple]:
    """Host µs per call of a packed batch's training call (64 sequences of 64-511 tokens,
    H 16/4, D 128, bf16, causal): ``varlen_attn`` (its eager route) against the same through
    its custom op ``tiledattention::varlen_fwd`` (what every call took before the route) and
    FlashAttention-4's ``flash_attn_varlen_func`` where installed. ``profile``: a cProfile of
    ``varlen_attn``'s backward and forward first."""
    gen = torch.Generator().manual_seed(1)
    lens = torch.randint(64, 512, (64,), generator=gen)
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0))).to(torch.int32).cuda()
    tokens, longest = int(lens.sum()), int(lens.max())
    q = torch.randn(tokens, 16, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn(tokens, 4, 128, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(2))
    g = torch.randn_like(q)
    routes = {
        "varlen_attn": lambda: tiledattention.varlen_attn(q, k, v, cu, cu, longest, longest,
                                                          is_causal=True, enable_gqa=True),
        "the custom op": lambda: torch.ops.tiledattention.varlen_fwd(
            q, k, v, cu, cu, longest, longest, True, True, None, -1, -1)[0]}
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - not installed: no such contender
        pass
    else:
        def fa4():
            out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                         max_seqlen_q=longest, max_seqlen_k=longest, causal=True)
            return out[0] if isinstance(out, tuple) else out
        routes["fa4"] = fa4
    if profile:  # warm first: compiles, plans
        torch.autograd.grad(routes["varlen_attn"](), (q, k, v), g)
        print(_profile(lambda q, k, v: routes["varlen_attn"](), q, k, v, g, calls))
    times: dict[tuple[str, str], list[float]] = {}
    outs = {name: fn() for name, fn in routes.items()}
    for _ in range(repeats):
        for name, fn in routes.items():
            out = outs[name]
            steps = {"fwd": fn,
                     "bwd": lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True),
                     "fwd+bwd": lambda: torch.autograd.grad(fn(), (q, k, v), g)}
            for what, step in steps.items():
                step()
                times.setdefault((name, what), []).append(_per_call(step, calls))
    return [(f"packed 64 seqs, {tokens} tokens", name,
             *(statistics.median(times[(name, w)]) for w in ("fwd", "bwd", "fwd+bwd")),
             _gpu_ms(lambda: torch.autograd.grad(fn(), (q, k, v), g)))
            for name, fn in routes.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    require_gpu()
    rows = []
    for index, (b, hq, hkv, s, d) in enumerate(SHAPES):
        q, k, v, g = _inputs(b, hq, hkv, s, d)
        contenders = _contenders(hq, hkv)
        outs = {name: fn(q, k, v) for name, fn in contenders.items()}
        for name, out in outs.items():  # warm: compile, plan, autotune
            torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
        if args.profile and index == 0:
            print(_profile(contenders["tiledattention"], q, k, v, g, args.calls))
        # few calls for the large shapes, so the launch queue never fills
        calls = args.calls if s * s * b * hq < 2**28 else max(10, args.calls // 10)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for name, fn in contenders.items():
                out = outs[name]
                steps = {
                    "fwd": lambda: fn(q, k, v),
                    "bwd": lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True),
                    "fwd+bwd": lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), g)}
                for what, step in steps.items():
                    times.setdefault((name, what), []).append(_per_call(step, calls))
        for name, fn in contenders.items():
            out = outs[name]
            gpu = _gpu_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), g))
            rows.append((f"B{b} H{hq}/{hkv} S{s} D{d}", name,
                         *(statistics.median(times[(name, w)]) for w in ("fwd", "bwd",
                                                                         "fwd+bwd")), gpu))
    rows += _packed_rows(args.calls, args.repeats, args.profile)
    print(f"host µs per call, median of {args.repeats} rounds (bf16, causal); gpu: µs of "
          "fwd+bwd per call on the GPU (a host figure at or above it: the queue was full)")
    print(f"{'shape':30s} {'who':15s} {'fwd':>8s} {'bwd':>8s} {'fwd+bwd':>8s} {'gpu':>8s}")
    for shape, name, fwd, bwd, both, gpu in rows:
        print(f"{shape:30s} {name:15s} {fwd:8.1f} {bwd:8.1f} {both:8.1f} {gpu:8.1f}")


if __name__ == "__main__":
    main()
