"""The backward's dQ kernel with a K/V group's query heads packed into one tile
(``BackwardSchedule.dq_pack_gqa``) against the same schedule unpacked, on packed
variable-length batches (``varlen_attn``'s backward) and dense training calls
(``sdpa_backward`` with the schedule given), GPU time (``time_interleaved``: one call between
events, a spin ahead hides the host, the L2 flushed), contenders interleaved, medians.
FlashAttention-4's backward beside where importable (``flash_attn_varlen_func`` /
``flash_attn_func`` on its own layouts). Every contender's gradients are checked against the
float32 reference first (the largest relative L2 error of dQ, dK, dV).

- ``default``: the call as it resolves a schedule; ``unpacked`` / ``packed``: that schedule
  with ``dq_pack_gqa`` off / on. ``--splits``: packed batches only, the resolved schedule
  with ``dkdv_splits`` 2, 4 and 8 (``splitN``; a ragged walk's splits) instead.

    source .devtk/setup.sh && python3 docs/records/probes/backward_pack_gqa.py [--only NAME]
    source .devtk/setup.sh && python3 docs/records/probes/backward_pack_gqa.py --set new
    source .devtk/setup.sh && python3 docs/records/probes/backward_pack_gqa.py --splits
"""

import argparse

import torch

import tiledattention as ta
from tiledattention import BACKWARD
from tiledattention.core._problem import Problem
from tiledattention.kernels.backward import _family
from tiledattention.tooling import varlen_reference
from tuner.measure import time_interleaved

from packed_batches import fa4_backward, log_uniform, pairs, rel, uniform  # this directory's

PACK = [None]  # the ragged backward's schedule fields (set per contender; None: as resolved)
_plain_launches = _family.launches


def _launches(problem, schedule, scale):
    if PACK[0] is not None:
        schedule = schedule.replace(**PACK[0])
    return _plain_launches(problem, schedule, scale)


_family.launches = _launches
SPLITS = [False]  # --splits: the ragged contenders are dK/dV split counts


def ragged_batches():
    g = torch.Generator().manual_seed(53)
    # name: (lengths, H_q, H_kv, D, causal, dtype)
    return {
        "vit-gqa4": (uniform(g, 80, 50, 300), 32, 8, 128, False, torch.bfloat16),
        "chat-short-gqa4": (uniform(g, 64, 16, 512), 32, 8, 128, True, torch.bfloat16),
        "mqa-short": (uniform(g, 128, 8, 160), 16, 1, 128, True, torch.bfloat16),
        "mqa-mix": (log_uniform(g, 40, 16, 3000), 16, 1, 128, True, torch.bfloat16),
        "gqa8-d64-short": (uniform(g, 100, 20, 300), 16, 2, 64, True, torch.float16),
        "sft-gqa4": (log_uniform(g, 24, 60, 6000), 32, 8, 128, True, torch.bfloat16),
        "skewed-gqa8": ([8000] + uniform(g, 60, 50, 400), 32, 4, 128, True, torch.bfloat16),
        "near-equal-gqa4": (uniform(g, 16, 1900, 2100), 32, 8, 128, True, torch.float16),
    }


def new_batches():
    """``--set new``: packed batches none of the others are, around the default's bound."""
    g = torch.Generator().manual_seed(54)
    return {
        "enc-gqa4-d64": (uniform(g, 96, 30, 500), 16, 4, 64, False, torch.bfloat16),
        "chat-gqa8-fp16": (uniform(g, 80, 20, 400), 32, 4, 128, True, torch.float16),
        "short-gqa2": (uniform(g, 120, 16, 256), 16, 8, 128, True, torch.bfloat16),
        "mid-gqa4": (uniform(g, 40, 300, 1000), 32, 8, 128, True, torch.bfloat16),
        "mid-mqa": (uniform(g, 60, 100, 900), 16, 1, 128, True, torch.bfloat16),
        "mid-gqa4-d64": (uniform(g, 48, 200, 1000), 16, 4, 64, False, torch.float16),
        "mixed-gqa4": ([1500] + uniform(g, 60, 20, 300), 32, 8, 128, True, torch.bfloat16),
    }


def dense_calls():
    # name: (B, H_q, H_kv, S, D, causal, dtype)
    return {
        "B1-H32/8-S4096-D128-causal": (1, 32, 8, 4096, 128, True, torch.bfloat16),
        "B2-H16/4-S3000-D64-causal": (2, 16, 4, 3000, 64, True, torch.bfloat16),
        "B4-H8/1-S2048-D128-causal": (4, 8, 1, 2048, 128, True, torch.float16),
        "B2-H32/8-S2048-D128-full": (2, 32, 8, 2048, 128, False, torch.bfloat16),
        "B8-H32/8-S512-D128-causal": (8, 32, 8, 512, 128, True, torch.bfloat16),
    }


def _fa4(name):
    try:
        import flash_attn.cute as fa
    except Exception:  # not installed here
        return None
    return getattr(fa, name)


def _errors(fns, reference):
    return {n: max(rel(g, r) for g, r in zip(fn(), reference)) for n, fn in fns.items()}


def ragged_contenders(lengths, hq, hkv, d, causal, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=dtype, generator=g)
               for h in (hq, hkv, hkv))
    do = torch.randn(t, hq, d, device="cuda", dtype=dtype, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device="cuda")
    longest = max(lengths)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = torch.autograd.grad(varlen_reference(*leaves, cu, cu, causal=causal), leaves,
                              do.float())
    ours = [x.detach().requires_grad_() for x in (q, k, v)]
    out = ta.varlen_attn(*ours, cu, cu, longest, longest, is_causal=causal, enable_gqa=True)

    def call(fields):
        def run():
            PACK[0] = fields
            return torch.autograd.grad(out, ours, do, retain_graph=True)
        return run
    if SPLITS[0]:
        fns = {"default": call(None), **{f"split{n}": call(dict(dkdv_splits=n))
                                         for n in (2, 4, 8)}}
    else:
        fns = {"default": call(None), "unpacked": call(dict(dq_pack_gqa=False)),
               "packed": call(dict(dq_pack_gqa=True))}
    fa4 = _fa4("flash_attn_varlen_func")
    if fa4 is not None:
        fns["flash-attn-4"] = fa4_backward(fa4, q, k, v, do, cu, longest, causal)
    flops = 2.5 * 4 * hq * d * pairs(lengths, causal)
    return fns, _errors(fns, ref), flops


def dense_contenders(b, hq, hkv, s, d, causal, dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)
               for h in (hq, hkv, hkv))
    do = torch.randn(b, hq, s, d, device="cuda", dtype=dtype, generator=g)
    problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                      dtype="bf16" if dtype == torch.bfloat16 else "fp16", causal=causal)
    default = BACKWARD.default_schedule("sm_90", problem)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref_out = torch.nn.functional.scaled_dot_product_attention(
        *leaves, is_causal=causal, enable_gqa=True)
    ref = torch.autograd.grad(ref_out, leaves, do.float())
    out, lse = ta.sdpa_with_lse(q, k, v, causal=causal)

    def call(schedule):
        return lambda: ta.sdpa_backward(do, q, k, v, out, lse, causal, schedule=schedule)
    fns = {"unpacked": call(default.replace(dq_pack_gqa=False)),
           "packed": call(default.replace(dq_pack_gqa=True))}
    fa4 = _fa4("flash_attn_func")
    if fa4 is not None:  # its own [B, S, H, D] layout, made contiguous outside the timing
        lt = [x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
        o4 = fa4(*lt, causal=causal)
        o4 = o4[0] if isinstance(o4, tuple) else o4
        dot = do.transpose(1, 2).contiguous()

        def flash():
            return tuple(x.transpose(1, 2) for x in
                         torch.autograd.grad(o4, lt, dot, retain_graph=True))
        fns["flash-attn-4"] = flash
    flops = 2.5 * 4 * b * hq * d * (s * (s + 1) // 2 if causal else s * s)
    return fns, _errors(fns, ref), flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--set", default="", help="new: the batches of new_batches() only")
    ap.add_argument("--splits", action="store_true",
                    help="packed batches: the resolved schedule with 2, 4 and 8 dK/dV splits")
    args = ap.parse_args()
    SPLITS[0] = args.splits
    only = set(filter(None, args.only.split(",")))
    if args.splits:
        todo = [(n, ragged_contenders, c) for n, c in
                {**ragged_batches(), **new_batches()}.items()]
    elif args.set == "new":
        todo = [(n, ragged_contenders, c) for n, c in new_batches().items()]
    else:
        todo = [(n, ragged_contenders, c) for n, c in ragged_batches().items()]
        todo += [(n, dense_contenders, c) for n, c in dense_calls().items()]
    rows = []
    for name, make, case in todo:
        if only and name not in only:
            continue
        fns, errs, flops = make(*case)
        ms = {n: t.median_ms for n, t in time_interleaved(fns, rounds=args.rounds).items()}
        print(f"{name}: " + ", ".join(f"{n} {ms[n] * 1e3:.1f} us ({flops / ms[n] / 1e9:.0f} "
                                       f"TF/s, err {errs[n]:.1e})" for n in fns), flush=True)
        rows.append((name, ms, errs))
    if args.splits:
        print("\n| batch | default us | split2 | split4 | split8 | FA4 / default |"
              "\n|---|---|---|---|---|---|")
        for name, ms, errs in rows:
            fa4 = f"{ms['flash-attn-4'] / ms['default']:.3f}" if "flash-attn-4" in ms else ""
            print(f"| {name} | {ms['default'] * 1e3:.1f} | " + " | ".join(
                f"{ms['default'] / ms[f'split{n}']:.3f}" for n in (2, 4, 8)) + f" | {fa4} |")
        return
    print("\n| call | unpacked us | packed us | packed speed-up | default us | FA4 us | "
          "FA4 / default | worst error |\n|---|---|---|---|---|---|---|---|")
    for name, ms, errs in rows:
        base = ms.get("default", ms["packed"])  # a dense call times no default
        fa4 = (f"{ms['flash-attn-4'] * 1e3:.1f} | {ms['flash-attn-4'] / base:.3f}"
               if "flash-attn-4" in ms else "| ")
        default = f"{ms['default'] * 1e3:.1f}" if "default" in ms else ""
        print(f"| {name} | {ms['unpacked'] * 1e3:.1f} | {ms['packed'] * 1e3:.1f} | "
              f"{ms['unpacked'] / ms['packed']:.3f} | {default} | {fa4} | "
              f"{max(errs.values()):.1e} |")


if __name__ == "__main__":
    main()
