"""Issue 32's benchmark (GPU): sliding windows, logit softcap and attention sinks against what a
user has instead, forward, backward and decode, bf16.

    python scripts/variants_bench.py --out DIR [--rounds 15] [--only NAME]

Contenders, all on the same tensors, interleaved (``time_interleaved``: L2 flushed before each
sample, median of ``--rounds``):
- ``tiledattention``: ``tiledattention.sdpa(..., window=, softcap=, sinks=)``;
- ``flex``: ``torch.compile(flex_attention)`` with the same mask as a ``BlockMask`` (built once,
  outside the timing) and the softcap as its ``score_mod``; sinks through the returned
  log-sum-exp (``out * sigmoid(lse - sink)``, what a FlexAttention user writes);
- ``sdpa-mask``: ``F.scaled_dot_product_attention`` with the materialised boolean mask (what
  transformers does for a sliding window), on torch's efficient backend; windows only.
Each point first checks every contender's output (and gradients) against the float32
reference by relative L2 error. The windowed points also time full causal attention at their
length (tiledattention), so ``TFLOP/s of the window (in-window work) / TFLOP/s of full causal``
is reported. Decode points report the bytes of the window's K and V over the time, against the
device's copy rate measured in the same run, and time beside the call what reading the window
alone costs: a cache of the window's length (no window) on tiledattention and on cuDNN, and a
device copy of the window's bytes. Writes ``DIR/variants.csv`` and
``DIR/variants.md`` and prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _study import run_points
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tiledattention import Problem
from tiledattention.tooling import attention_reference, visible_keys
from tuner.bench import flex_mask_mod, flex_score_mod
from tuner.measure import time_interleaved

#: name, (B, H_q, H_kv, S_q, S_k, D), causal ("top_left" / "bottom_right" / False),
#: window (left, right) or None, softcap or None, sinks, phases
POINTS = (
    ("window4096@32k", (1, 32, 8, 32768, 32768, 128), True, (4095, 0), None, False,
     ("fwd", "bwd")),
    ("window128@8k", (4, 32, 8, 8192, 8192, 128), True, (127, 0), None, False, ("fwd", "bwd")),
    ("mistral-window4096@8k", (2, 32, 8, 8192, 8192, 128), True, (4095, 0), None, False,
     ("fwd", "bwd")),
    ("gemma2-softcap50", (2, 16, 8, 4096, 4096, 256), True, None, 50.0, False, ("fwd", "bwd")),
    ("gemma2-local-softcap", (2, 16, 8, 8192, 8192, 256), True, (4095, 0), 50.0, False,
     ("fwd", "bwd")),
    ("gptoss-sinks", (2, 64, 8, 4096, 4096, 64), True, None, None, True, ("fwd", "bwd")),
    ("gptoss-window128-sinks", (2, 64, 8, 4096, 4096, 64), True, (127, 0), None, True,
     ("fwd", "bwd")),
    ("decode-window4096@128k", (1, 32, 8, 1, 131072, 128), "bottom_right", (4095, 0), None,
     False, ("decode",)),
    ("decode-window4096@128k-b8", (8, 32, 8, 1, 131072, 128), "bottom_right", (4095, 0), None,
     False, ("decode",)),
)
OURS = "tiledattention"
#: decode's yardsticks for reading the window alone
WINDOW_CACHE = "tiledattention, window-length cache"
WINDOW_CACHE_CUDNN = "cudnn, window-length cache"
WINDOW_COPY = "copy of the window's bytes"


def problem_of(shape: tuple, causal, window, softcap, sinks) -> Problem:
    b, hq, hkv, sq, sk, d = shape
    left, right = window or (-1, -1)
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype="bf16", causal=bool(causal), bottom_right=causal == "bottom_right",
                   window_left=left, window_right=right, softcap=softcap or 0.0, sinks=sinks)


def flex_contender(problem: Problem, sinks_t):
    """Compiled FlexAttention with the problem's mask and softcap (``tuner.bench``'s
    ``flex_mask_mod`` / ``flex_score_mod``, the bench's own), sinks through its LSE."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(flex_mask_mod(problem), None, None, problem.seqlen_q,
                                   problem.seqlen_k, device="cuda")
    kwargs = dict(score_mod=flex_score_mod(problem), block_mask=block_mask,
                  enable_gqa=problem.heads_q != problem.heads_kv)
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v):
        if sinks_t is None:
            return compiled(q, k, v, **kwargs)
        out, lse = compiled(q, k, v, return_lse=True, **kwargs)
        weight = torch.sigmoid(lse - sinks_t.view(1, -1, 1).float())  # lse: natural log
        return (out.float() * weight[..., None]).to(q.dtype)
    return run


def contenders(problem: Problem, causal, window, softcap, sinks_t) -> dict:
    found = {OURS: lambda q, k, v: tiledattention.sdpa(q, k, v, causal, window=window,
                                                       softcap=softcap, sinks=sinks_t)}
    found["flex"] = flex_contender(problem, sinks_t)
    if problem.windowed and problem.softcap == 0 and not problem.sinks:
        # what transformers' SDPA path runs: K/V heads repeated (its repeat_kv; the efficient
        # backend takes no grouped heads) and the materialised boolean mask
        mask = visible_keys(problem, torch.device("cuda"))
        group = problem.heads_q // problem.heads_kv

        def masked(q, k, v):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return F.scaled_dot_product_attention(
                    q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                    attn_mask=mask)
        found["sdpa-mask"] = masked
    return found


def rel_l2(a, b) -> float:
    return (torch.linalg.vector_norm(a.float() - b.float())
            / torch.linalg.vector_norm(b.float())).item()


def copy_rate(nbytes: int, rounds: int) -> float:
    """The device's copy rate in bytes per ms, counting bytes read plus bytes written, of a
    device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = time_interleaved({"copy": lambda: dst.copy_(src)}, rounds=rounds)["copy"]
    return 2 * nbytes / t.median_ms


def measure(point: tuple, rounds: int) -> list[dict]:
    name, shape, causal, window, softcap, sinks, phases = point
    problem = problem_of(shape, causal, window, softcap, sinks)
    torch._dynamo.reset()  # each point compiles flex anew: no recompile limit, no stale graph
    b, hq, hkv, sq, sk, d = shape
    gen = torch.Generator(device="cuda").manual_seed(sq + hq)

    def make(*dims):
        return torch.randn(*dims, device="cuda", dtype=torch.bfloat16, generator=gen)

    q, k, v = make(b, hq, sq, d), make(b, hkv, sk, d), make(b, hkv, sk, d)
    if softcap:
        q = q * 4  # logits large enough for the cap to bind
    sinks_t = (torch.randn(hq, device="cuda", generator=gen) + 2.0) if sinks else None
    fns = contenders(problem, causal, window, softcap, sinks_t)
    records = []
    if "decode" in phases:
        want = attention_reference(q, k, v, problem, sinks=sinks_t)
        timed = {}
        for who, f in fns.items():
            try:
                err = rel_l2(f(q, k, v), want)
            except Exception as exc:  # a contender that cannot run the point
                records.append(dict(point=name, contender=who, phase="decode",
                                    status=f"{type(exc).__name__}: {exc}"[:100]))
                continue
            timed[who] = (lambda f=f: f(q, k, v))
            records.append(dict(point=name, contender=who, phase="decode", rel_l2=err))
        window_keys = min(sk, (window[0] + 1) if window else sk)
        nbytes = 2 * b * hkv * window_keys * d * 2
        # what reading only the window can cost at best, timed alongside: a cache of the
        # window's length (contiguous, no window) on ours and on cuDNN, and a copy of the
        # window's bytes (its share counts the bytes it reads and writes)
        k_w, v_w = k[:, :, -window_keys:].contiguous(), v[:, :, -window_keys:].contiguous()
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        dst = torch.empty_like(src)
        timed[WINDOW_CACHE] = lambda: tiledattention.sdpa(q, k_w, v_w, sinks=sinks_t,
                                                          softcap=softcap)
        if not (softcap or sinks):
            def cudnn_window():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k_w, v_w, enable_gqa=True)
            timed[WINDOW_CACHE_CUDNN] = cudnn_window
        timed[WINDOW_COPY] = lambda: dst.copy_(src)
        for who in (WINDOW_CACHE, WINDOW_CACHE_CUDNN, WINDOW_COPY):
            if who in timed:
                records.append(dict(point=name, contender=who, phase="decode"))
        rate = copy_rate(max(nbytes, 1 << 28), rounds)
        times = time_interleaved(timed, rounds=rounds)
        for r in records:
            if r.get("contender") in times:
                ms = times[r["contender"]].median_ms
                moved = 2 * nbytes if r["contender"] == WINDOW_COPY else nbytes
                r.update(status="ok", ms=ms, window_bytes=nbytes,
                         copy_share=(moved / ms) / rate)
        return records
    flops = 4.0 * b * hq * d * problem.attended_pairs
    leaves = [x.requires_grad_() for x in (q, k, v)]
    grad_out = make(b, hq, sq, d)
    with torch.no_grad():
        want = attention_reference(q, k, v, problem, sinks=sinks_t)
    # reference gradients by autograd through the explicit reference, where its saved scores
    # fit (8 GiB); beyond, every contender's gradients are compared with flex's
    want_grads = None
    if b * hq * sq * sk <= 1 << 30:
        ref = attention_reference(*leaves, problem, sinks=sinks_t)
        want_grads = torch.autograd.grad(ref, leaves, grad_out)
        del ref
    fwd, bwd, grads = {}, {}, {}
    for who, f in fns.items():
        rec = dict(point=name, contender=who)
        try:
            with torch.no_grad():
                rec["rel_l2"] = rel_l2(f(q, k, v), want)
            fwd[who] = (lambda f=f: f(q.detach(), k.detach(), v.detach()))
            out = f(*leaves)
            grads[who] = torch.autograd.grad(out, leaves, grad_out, retain_graph=True)
            bwd[who] = (lambda out=out: torch.autograd.grad(out, leaves, grad_out,
                                                            retain_graph=True))
        except Exception as exc:  # a contender that cannot run (or differentiate) the point
            rec["status"] = f"{type(exc).__name__}: {exc}"[:100]
        records.append(rec)
    against = want_grads if want_grads is not None else grads.get("flex")
    for rec in records:
        if against is not None and rec["contender"] in grads:
            rec["grad_rel_l2"] = max(rel_l2(a, r)
                                     for a, r in zip(grads[rec["contender"]], against))
            rec["grad_vs"] = "reference" if want_grads is not None else "flex"
    torch.cuda.synchronize()
    if problem.windowed:  # full causal attention at this length: the 0.85x bar
        full = problem_of(shape, True, None, softcap, sinks)
        fwd["full-causal"] = (lambda: tiledattention.sdpa(q.detach(), k.detach(), v.detach(),
                                                          True, softcap=softcap,
                                                          sinks=sinks_t))
        full_flops = 4.0 * b * hq * d * full.attended_pairs
    for phase, timed_fns, scale in (("fwd", fwd, 1.0), ("bwd", bwd, 2.5)):
        if phase not in phases or not timed_fns:
            continue
        times = time_interleaved(timed_fns, rounds=rounds)
        for who, t in times.items():
            count = (full_flops if who == "full-causal" else flops) * scale
            base = next((r for r in records if r["contender"] == who), None)
            row = dict(point=name, contender=who, phase=phase, status="ok", ms=t.median_ms,
                       tflops=count / t.median_ms / 1e9)
            if base is not None:
                row.update({k: base[k] for k in ("rel_l2", "grad_rel_l2", "grad_vs")
                            if k in base})
            records.append(row)
    return [r for r in records if "phase" in r or "status" in r]


def table(records: list[dict]) -> list[str]:
    lines = ["| point | phase | tiledattention | ÷ flex | ÷ sdpa-mask | window ÷ full causal "
             "| rel L2 (ours) |", "|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    keys = dict.fromkeys((r["point"], r["phase"]) for r in records if r.get("status") == "ok")
    for point, phase in keys:
        rows = {r["contender"]: r for r in records
                if r["point"] == point and r.get("phase") == phase and r.get("status") == "ok"}
        ours = rows.get(OURS)
        if ours is None:
            continue
        cells = []
        for other in ("flex", "sdpa-mask"):
            if other in rows:
                ratio = rows[other]["ms"] / ours["ms"]
                ratios.setdefault(f"{phase} ÷ {other}", []).append(ratio)
                cells.append(f"{ratio:.2f}")
            else:
                cells.append("n/a")
        full = rows.get("full-causal")
        cells.append(f"{ours['tflops'] / full['tflops']:.2f}" if full else "")
        if phase == "decode":
            shown = f"{ours['ms'] * 1e3:.1f} µs, {100 * ours['copy_share']:.0f}% of copy rate"
            shown += "".join(f"; {who}: {rows[who]['ms'] * 1e3:.1f} µs, "
                             f"{100 * rows[who]['copy_share']:.0f}%"
                             for who in (WINDOW_CACHE, WINDOW_CACHE_CUDNN, WINDOW_COPY)
                             if who in rows)
        else:
            shown = f"{ours['tflops']:.0f} TFLOP/s"
        err = ours.get("grad_rel_l2", ours.get("rel_l2"))
        lines.append(f"| {point} | {phase} | {shown} | {' | '.join(cells)} | "
                     f"{'' if err is None else f'{err:.1e}'} |")
    lines += ["", "| phase | geometric mean | min | points |", "|---|---|---|---|"]
    for key, values in ratios.items():
        geo = math.exp(sum(map(math.log, values)) / len(values))
        lines.append(f"| {key} | {geo:.3f} | {min(values):.2f} | {len(values)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", action="append", default=[],
                        help="run only the named point(s)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = run_points(POINTS, args.only, lambda point: measure(point, args.rounds),
                      lambda point, why: dict(point=point[0], contender=OURS, phase="-",
                                              status=why),
                      write, args.out)
    print(text)
    return 0


def write(records: list[dict], out: Path) -> str:
    """Write ``variants.csv`` and ``variants.md`` of ``records``; the markdown text."""
    fields = sorted({key for r in records for key in r})
    with open(out / "variants.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    lines = table(records)
    failed = [f"- {r['point']} {r['contender']}: {r['status']}" for r in records
              if r.get("status", "ok") != "ok"]
    text = "\n".join(lines + ([""] + failed if failed else [])) + "\n"
    (out / "variants.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
