"""Packed batches on the GPU (issue 50): ``tiledattention.varlen_attn`` against torch's
``varlen_attn`` and FlashAttention-4's ``flash_attn_varlen_func`` (where importable), forward
and backward, in three views, on the issue's five batches and more:

- ``gpu``: each sample one call between CUDA events, a spin ahead of it hides the host's launch
  time, the L2 flushed first (``time_interleaved``);
- ``loop``: steady state as a training loop sees it: ``LOOP`` calls back to back between two
  events, no flush, no spin (a host slower than the GPU sets the pace), per call;
- ``host``: an isolated call from an idle GPU, the host's time counted.

Contenders are interleaved sample by sample. TFLOP/s count the valid tokens' attended pairs
(``4 H D pairs`` forward, 2.5x that backward). Each contender's output (and gradients) is
checked against the float32 reference first. ``rectangle``: our ``sdpa`` on one rectangular
batch of the same tokens at the mean length (``fa4-rectangle``: FA4's ``flash_attn_func`` on
it). ``--profile NAME`` prints our kernels' GPU times for one batch (torch.profiler; the
backward's of the rectangle too). ``--grid`` adds our forward and backward with every kernel on
its grid of the longest sequence's tiles (no work tables: ``tiledattention-grid``),
``--table`` with every kernel walking a work table (``tiledattention-table``). ``--set new``:
eight other batches. ``--unpacked`` adds our forward with K/V groups unpacked
(``tiledattention-unpacked``).

    source .devtk/setup.sh && python3 docs/records/probes/packed_batches.py [--only NAME]
"""

import argparse
import inspect
import math
import statistics

import torch

import tiledattention as ta
from tiledattention.tooling import varlen_reference
from tuner.measure import time_interleaved

LOOP = 20


def log_uniform(gen, n, lo, hi):
    return [int(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) *
                         torch.rand(1, generator=gen).item())) for _ in range(n)]


def uniform(gen, n, lo, hi):
    return [int(torch.randint(lo, hi + 1, (1,), generator=gen)) for _ in range(n)]


def batches():
    g = torch.Generator().manual_seed(50)
    # name: (lengths, H_q, H_kv, D, causal, dtype)
    return {
        "sft": (log_uniform(g, 24, 60, 6000), 32, 8, 128, True, torch.bfloat16),
        "pretrain": ([2048] * 7 + [1111, 937], 16, 16, 64, True, torch.bfloat16),
        "chat": ([12000] + uniform(g, 40, 20, 700), 28, 4, 128, True, torch.bfloat16),
        "encoder": (uniform(g, 64, 30, 512), 12, 12, 64, False, torch.bfloat16),
        "long-docs": ([30000, 17000, 3000], 32, 8, 128, True, torch.float16),
        "short-gqa7": (uniform(g, 96, 16, 400), 28, 4, 128, True, torch.bfloat16),
        "near-equal": (uniform(g, 16, 1900, 2100), 32, 8, 128, True, torch.float16),
        "encoder-d128": (uniform(g, 128, 16, 512), 16, 16, 128, False, torch.float16),
        "encoder-d128-1k": (uniform(g, 40, 64, 1024), 16, 16, 128, False, torch.bfloat16),
        "encoder-d128-2k": (uniform(g, 24, 128, 2048), 12, 12, 128, False, torch.bfloat16),
        "vit-d128-gqa": (uniform(g, 80, 50, 300), 32, 8, 128, False, torch.bfloat16),
    }


def packed_call(lengths, hq, hkv, d, causal, dtype):
    """A packed batch's random ``q, k, v, do`` (``[tokens, H, D]``, seed 1), its offsets
    ``cu``, the longest length and ``varlen_attn``'s validated call (``_prepare``'s)."""
    from tiledattention.entry_points._varlen import _prepare

    t = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(t, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(t, hkv, d, device="cuda", dtype=dtype, generator=g)
    do = torch.randn(t, hq, d, device="cuda", dtype=dtype, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    longest = max(lengths)
    return q, k, v, do, cu, longest, _prepare(q, k, v, cu, cu, longest, longest, causal, None,
                                              None, hq != hkv)


def pairs(lengths, causal):
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fa4_call(cu, longest, causal):
    """FlashAttention-4's ``flash_attn_varlen_func`` on the packed batch of offsets ``cu`` as
    ``call(q, k, v)``, or None where it does not import (said so)."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as exc:  # not installed here
        print(f"# flash-attn-4 unavailable: {type(exc).__name__}: {exc}"[:200])
        return None

    def fa4(q, k, v):
        out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                     max_seqlen_q=longest, max_seqlen_k=longest, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return fa4


def contenders(lengths, hq, hkv, d, causal, dtype):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    t = sum(lengths)
    q = torch.randn(t, hq, d, device=dev, dtype=dtype, generator=g)
    k = torch.randn(t, hkv, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(t, hkv, d, device=dev, dtype=dtype, generator=g)
    do = torch.randn(t, hq, d, device=dev, dtype=dtype, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=dev)
    longest = max(lengths)
    ref = varlen_reference(q.float(), k.float(), v.float(), cu, cu, causal=causal)
    calls = {"tiledattention": lambda q, k, v: ta.varlen_attn(
        q, k, v, cu, cu, longest, longest, is_causal=causal, enable_gqa=hq != hkv)}
    rep = hq // hkv
    try:
        from torch.nn.attention.varlen import varlen_attn as torch_varlen

        def tv(q, k, v):
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            if "window_size" in inspect.signature(torch_varlen).parameters:
                return torch_varlen(q, k, v, cu, cu, longest, longest,
                                    window_size=(-1, 0) if causal else (-1, -1))
            return torch_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal)
        calls["torch-varlen"] = tv
    except ImportError:
        pass
    fa4 = fa4_call(cu, longest, causal)
    if fa4 is not None:
        calls["flash-attn-4"] = fa4
    mean = round(t / len(lengths))
    rb = max(1, round(t / mean))
    qr = torch.randn(rb, hq, mean, d, device=dev, dtype=dtype, generator=g)
    kr = torch.randn(rb, hkv, mean, d, device=dev, dtype=dtype, generator=g)
    vr = torch.randn(rb, hkv, mean, d, device=dev, dtype=dtype, generator=g)

    fwd, bwd, errs = {}, {}, {}
    for name, fn in calls.items():
        with torch.no_grad():
            errs[name] = rel(fn(q, k, v), ref)
        fwd[name] = (lambda fn=fn: fn(q, k, v))
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves)
        bwd[name] = (lambda out=out, leaves=leaves:
                     torch.autograd.grad(out, leaves, do, retain_graph=True))
    fwd["rectangle"] = lambda: ta.sdpa(qr, kr, vr, causal)
    lr = [x.detach().requires_grad_() for x in (qr, kr, vr)]
    outr = ta.sdpa(*lr, causal)
    dor = torch.randn_like(outr)
    bwd["rectangle"] = lambda: torch.autograd.grad(outr, lr, dor, retain_graph=True)
    if fa4 is not None:  # FA4 on the same rectangle, its [B, S, H, D] layout
        from flash_attn.cute import flash_attn_func

        fr = [x.transpose(1, 2).contiguous().detach().requires_grad_() for x in (qr, kr, vr)]

        def fa4_rect(*xs):
            out = flash_attn_func(*xs, causal=causal)
            return out[0] if isinstance(out, tuple) else out
        fwd["fa4-rectangle"] = lambda: fa4_rect(*fr)
        outf = fa4_rect(*fr)
        dof = dor.transpose(1, 2).contiguous()
        bwd["fa4-rectangle"] = lambda: torch.autograd.grad(outf, fr, dof, retain_graph=True)
    return fwd, bwd, errs, pairs([mean] * rb, causal) * 4 * hq * d


def new_batches():
    g = torch.Generator().manual_seed(51)
    return {
        "skewed-gqa8": ([8000] + uniform(g, 60, 50, 400), 32, 8, 128, True, torch.bfloat16),
        "docs-chat": ([6000, 5000] + uniform(g, 50, 30, 300), 28, 4, 128, True, torch.float16),
        "sft-d64": (log_uniform(g, 30, 100, 4000), 16, 16, 64, True, torch.bfloat16),
        "mqa-mix": (log_uniform(g, 40, 16, 3000), 16, 1, 128, True, torch.bfloat16),
        "bert-short": (uniform(g, 96, 16, 256), 12, 12, 64, False, torch.float16),
        "gqa7-long": ([9000, 700, 300], 28, 4, 128, True, torch.bfloat16),
        "near-equal-d64": (uniform(g, 24, 900, 1100), 16, 4, 64, True, torch.bfloat16),
        "vision-full": (uniform(g, 48, 100, 1500), 16, 16, 128, False, torch.bfloat16),
    }


def table_threshold(fn, threshold):
    """``fn`` with ragged launches walking a work table from ``threshold`` idle CTAs on (0:
    always; ``1 << 62``: never)."""
    from tiledattention.core import _work_table

    names = ("TABLE_MIN_IDLE_CTAS", "BACKWARD_TABLE_MIN_IDLE_CTAS")

    def run():
        saved = [getattr(_work_table, n) for n in names]
        for n in names:
            setattr(_work_table, n, threshold)
        try:
            return fn()
        finally:
            for n, value in zip(names, saved):
                setattr(_work_table, n, value)
    return run


def with_schedule_fields(fn, **fields):
    """``fn`` with every ragged forward launch's looked-up schedule given ``fields``."""
    from tiledattention.kernels.forward import _launch

    plain = _launch.ragged_launch

    def replaced(problem, schedule, *args, **kwargs):
        return plain(problem, schedule.replace(**fields), *args, **kwargs)

    def run():
        _launch.ragged_launch = replaced
        try:
            return fn()
        finally:
            _launch.ragged_launch = plain
    return run


def unpacked(fn):
    """``fn`` with every ragged forward launch's K/V groups unpacked (``pack_gqa`` off: the
    forward before 2026-12-01's default)."""
    return with_schedule_fields(fn, pack_gqa=False)


def loop_times(fns, rounds):
    samples = {n: [] for n in fns}
    for r in range(rounds):
        for name in list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]:
            fns[name]()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(LOOP):
                fns[name]()
            e.record()
            e.synchronize()
            samples[name].append(s.elapsed_time(e) / LOOP)
    return {n: statistics.median(v) for n, v in samples.items()}


def profile(fwd, bwd):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    for label, fn in (("fwd", fwd["tiledattention"]), ("bwd", bwd["tiledattention"]),
                      ("bwd of the rectangle", bwd["rectangle"])):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(f"## {label}: our kernels (10 calls)")
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--profile", default="")
    ap.add_argument("--views", default="gpu,loop,host")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--set", default="issue", choices=("issue", "new"))
    ap.add_argument("--phases", default="fwd,bwd")
    ap.add_argument("--unpacked", action="store_true",
                    help="add our forward with K/V groups unpacked (tiledattention-unpacked)")
    args = ap.parse_args()
    rows = []
    chosen = batches() if args.set == "issue" else new_batches()
    for name, (lengths, hq, hkv, d, causal, dtype) in chosen.items():
        if args.only and name not in args.only.split(","):
            continue
        fwd, bwd, errs, rect_flops = contenders(lengths, hq, hkv, d, causal, dtype)
        flops = pairs(lengths, causal) * 4 * hq * d
        print(f"# {name}: {len(lengths)} seqs, {sum(lengths)} tokens, longest {max(lengths)}, "
              f"H {hq}/{hkv} D {d} causal {causal} {dtype}; errors "
              + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
        if args.grid:
            fwd["tiledattention-grid"] = table_threshold(fwd["tiledattention"], 1 << 62)
            bwd["tiledattention-grid"] = table_threshold(bwd["tiledattention"], 1 << 62)
        if args.table:
            fwd["tiledattention-table"] = table_threshold(fwd["tiledattention"], 0)
            bwd["tiledattention-table"] = table_threshold(bwd["tiledattention"], 0)
        if args.unpacked:
            fwd["tiledattention-unpacked"] = unpacked(fwd["tiledattention"])
        if args.profile == name:
            profile(fwd, bwd)
        for phase, fns, mult in (("fwd", fwd, 1.0), ("bwd", bwd, 2.5)):
            if phase not in args.phases.split(","):
                continue
            for view in args.views.split(","):
                if view == "loop":
                    t = loop_times(fns, max(3, args.rounds // 3))
                else:
                    t = {n: x.median_ms for n, x in
                         time_interleaved(fns, rounds=args.rounds, host=view == "host").items()}
                ours = t["tiledattention"]
                tf = {n: (rect_flops if n in ("rectangle", "fa4-rectangle") else flops) * mult
                      / (ms * 1e-3) / 1e12 for n, ms in t.items()}
                line = (f"{name:13s} {phase} {view:4s} ours {ours * 1e3:8.1f} us "
                        f"{tf['tiledattention']:6.1f} TF/s | " + " ".join(
                            f"{n} {t[n] / ours:5.2f}x" for n in t if n != "tiledattention")
                        + f" | rect {tf['rectangle']:6.1f} TF/s")
                print(line, flush=True)
                rows.append(line)
    print("\n## summary (peer time / ours: > 1 where we are faster; rect TF/s of the rectangle)")
    for line in rows:
        print(line)


if __name__ == "__main__":
    main()
