"""The split kernel's last CTA merging its row (``DecodeSchedule(combine="last")``) against the
merge the default launches (issue 49, item 1): a stress test, then both timing views.

Stress (``--stress N``): per point, ``N`` launches of both schedules on the same inputs at
cache lengths drawn at random (1 to the point's; the plan is the longest's, as a growing cache
reuses it), the partial buffers of both filled with NaN before every launch (a partial read
before its split stored it comes out NaN); every launch's output checked against the other
schedule's and against a float32 reference. A mismatch: a non-finite output, or a relative L2
error past 1e-2 against either. The counters are read after the point (all zero: each call
leaves them as it found them).

Timing: GPU view (one call between events, the L2 flushed, interleaved, medians) and the
isolated view (an idle GPU, the host's time counted), with the share of the device copy rate
(read + written, timed in the same run) of the K/V bytes read once.

    source .devtk/setup.sh && python3 docs/records/probes/decode_last_merge.py --stress 500
"""

import argparse
import sys
from pathlib import Path

import torch

import tiledattention as ta
from tiledattention.kernels.decode._launch import launch, launches, new_scratch
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from paged_defaults import copy_rate  # noqa: E402

#: (label, B, H_q, H_kv, keys, D, dtype, extra Problem fields)
POINTS = (
    ("B1 32/8 D128 4k", 1, 32, 8, 4096, 128, "bf16", {}),
    ("B1 32/8 D128 8k", 1, 32, 8, 8192, 128, "bf16", {}),
    ("B1 32/8 D128 16k", 1, 32, 8, 16384, 128, "bf16", {}),
    ("B1 32/8 D128 32k", 1, 32, 8, 32768, 128, "bf16", {}),
    ("B1 32/8 D128 64k", 1, 32, 8, 65536, 128, "fp16", {}),
    ("B1 64/8 D128 12k", 1, 64, 8, 12000, 128, "bf16", {}),
    ("B1 28/4 D128 20k", 1, 28, 4, 20000, 128, "bf16", {}),
    ("B1 32/8 D64 16k", 1, 32, 8, 16384, 64, "bf16", {}),
    ("B1 16/2 D256 9k", 1, 16, 2, 9000, 256, "bf16", {}),
    ("B2 32/8 D128 24k", 2, 32, 8, 24000, 128, "fp16", {}),
    ("B4 28/4 D128 6k", 4, 28, 4, 6000, 128, "bf16", {}),
    ("B1 8/1 D128 50k", 1, 8, 1, 50000, 128, "bf16", {}),
    ("B1 64/8 D64 32k sinks", 1, 64, 8, 32768, 64, "bf16", {"sinks": True}),
)


#: paged batches of mixed lengths (the family's case: caches of the longest, 3/4, 1/2, 1/4 of
#: it in shuffled pages), timed through the case's launcher: (label, B, H_q, H_kv, keys, page)
PAGED_POINTS = (
    ("paged B4 32/8 16k p256", 4, 32, 8, 16000, 256),
    ("paged B8 28/4 8k p64", 8, 28, 4, 8000, 64),
    ("paged B12 32/8 5k p32", 12, 32, 8, 5000, 32),
    ("paged B6 32/8 12k p16", 6, 32, 8, 12000, 16),
)


def problem(b, hq, hkv, sk, d, dtype, extra):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                      dtype=dtype, causal=False, **extra)


def reference(q, k, v, sinks):
    """float32 decode of ``q [B, Hq, 1, D]`` over ``k, v [B, Hkv, L, D]`` (sinks: [Hq])."""
    rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(rep, 1)
    v = v.float().repeat_interleave(rep, 1)
    s = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if sinks is not None:
        s = torch.cat((s, sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, 1, 1)), -1)
        return (s.softmax(-1)[..., :-1]) @ v
    return s.softmax(-1) @ v


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Form:
    """One schedule's plan, scratch and launch on a case's inputs."""

    def __init__(self, p, schedule, case):
        self.plan = launches(p, schedule, None)
        self.scratch = new_scratch(self.plan, lambda shape: torch.empty(
            shape, dtype=torch.float32, device="cuda"))
        self.case = case
        self.out = torch.empty_like(case.q)

    def run(self, k, v):
        launch(torch.cuda.current_stream(), self.plan, self.case.q, k, v, self.out, 0,
               self.scratch, sinks=self.case.sinks)
        return self.out

    def poison(self):
        self.scratch[0].fill_(float("nan"))
        self.scratch[1].fill_(float("nan"))


def stress(label, p, forms, launches_n, gen):
    case = forms["last"].case
    worst = {name: 0.0 for name in forms}
    worst_pair = 0.0
    bad = 0
    for i in range(launches_n):
        length = int(torch.randint(1, p.seqlen_k + 1, (1,), generator=gen))
        k, v = case.k[:, :, :length], case.v[:, :, :length]
        outs = {}
        for name, form in forms.items():
            form.poison()
            outs[name] = form.run(k, v).clone()
        ref = reference(case.q, k, v, case.sinks)
        pair = rel(outs["last"], outs["default"])
        errs = {name: rel(out, ref) for name, out in outs.items()}
        finite = all(torch.isfinite(out).all().item() for out in outs.values())
        if not finite or pair > 1e-2 or max(errs.values()) > 1e-2:
            bad += 1
            if bad <= 3:
                print(f"  MISMATCH {label} launch {i} length {length}: pair {pair:.2e} "
                      f"errors {errs}", flush=True)
        worst_pair = max(worst_pair, pair)
        for name, e in errs.items():
            worst[name] = max(worst[name], e)
    counters = forms["last"].scratch[2]
    left = int((counters != 0).sum())
    print(f"stress {label}: {launches_n} launches, {bad} mismatches, worst last vs default "
          f"{worst_pair:.1e}, worst vs float32 last {worst['last']:.1e} default "
          f"{worst['default']:.1e}, counters not zero after: {left}", flush=True)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stress", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    copy_gbps = copy_rate()
    gen = torch.Generator().manual_seed(49)
    rows = []
    total_bad = total_launches = 0
    for label, b, hq, hkv, sk, d, dtype, extra in POINTS:
        if args.only and not any(o in label for o in args.only.split(",")):
            continue
        p = problem(b, hq, hkv, sk, d, dtype, extra)
        default = ta.DECODE.default_schedule("sm_90", p)
        if default.splits == 1:
            default = default.replace(splits=16, combine="block_pdl")
        case = ta.DECODE.case(p, 0)
        forms = {"default": Form(p, default, case),
                 "last": Form(p, default.replace(combine="last"), case)}
        if args.stress:
            total_bad += stress(label, p, forms, args.stress, gen)
            total_launches += args.stress
        fns = {name: (lambda f=form: f.run(case.k, case.v)) for name, form in forms.items()}
        kv_bytes = 2 * b * hkv * sk * d * 2
        line = [f"{label:24s} {default.describe():34s}"]
        for view in ("gpu", "host"):
            t = {n: x.median_ms for n, x in
                 time_interleaved(fns, rounds=args.rounds, host=view == "host").items()}
            share = {n: kv_bytes / (ms * 1e-3) / 1e9 / copy_gbps for n, ms in t.items()}
            line.append(f"{view}: default {t['default'] * 1e3:7.1f} us ({100 * share['default']:4.1f}%)"
                        f" last {t['last'] * 1e3:7.1f} us ({100 * share['last']:4.1f}%)"
                        f" x{t['default'] / t['last']:5.3f}")
        print(" | ".join(line), flush=True)
        rows.append(" | ".join(line))
    for label, b, hq, hkv, sk, page in PAGED_POINTS:
        if args.only and not any(o in label for o in args.only.split(",")):
            continue
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page)
        default = ta.DECODE.default_schedule("sm_90", p)
        if default.flat or default.splits == 1:
            print(f"{label}: default {default.describe()} has no merge to replace")
            continue
        case = ta.DECODE.case(p, 0)
        fns = {"default": case.launcher(default),
               "last": case.launcher(default.replace(combine="last"))}
        errs = {n: case.error(f) for n, f in fns.items()}
        kv_bytes = 2 * int(case.seqused.sum()) * hkv * 128 * 2
        line = [f"{label:24s} {default.describe():34s} err {errs['default']:.1e}/"
                f"{errs['last']:.1e}"]
        for view in ("gpu", "host"):
            t = {n: x.median_ms for n, x in
                 time_interleaved(fns, rounds=args.rounds, host=view == "host").items()}
            share = {n: kv_bytes / (ms * 1e-3) / 1e9 / copy_gbps for n, ms in t.items()}
            line.append(f"{view}: default {t['default'] * 1e3:7.1f} us ({100 * share['default']:4.1f}%)"
                        f" last {t['last'] * 1e3:7.1f} us ({100 * share['last']:4.1f}%)"
                        f" x{t['default'] / t['last']:5.3f}")
        print(" | ".join(line), flush=True)
        rows.append(" | ".join(line))
    print("\n## summary (xN: the default's time over last's, > 1 where last is faster)")
    if args.stress:
        print(f"stress: {total_launches} launches, {total_bad} mismatches")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
