"""FP8 (e4m3) prefill on the GPU (issue 52): the forward kernel with e4m3 Q, K, V and descale
factors against our bf16 forward of the same shape, for V as stored ([B, H_kv, S, D]: the
compiler transposes each tile through shared memory for the e4m3 matrix product) and V
transposed ahead ([B, H_kv, D, S], one copy per call counted in the time), P·V in e4m3 (P
shifted by 2^8) or in bf16. GPU time, L2 flushed, interleaved, median of ``--rounds``; errors
by relative L2 against a float32 reference of the dequantised inputs, and the bf16 kernel's
against its own inputs.

    source .devtk/setup.sh && python3 docs/records/probes/fp8_forward.py [--rounds N] [--only I,J]
"""

import argparse
import dataclasses
import math

import torch

import tiledattention as ta
from tiledattention.core._device import device_info
from tiledattention.core import _aot
from tiledattention.kernels.forward import _launch as L
from tiledattention.kernels.forward._defaults import default_schedule
from tuner.measure import time_interleaved

E4M3 = torch.float8_e4m3fn
SHAPES = [  # B, H_q, H_kv, S, D, causal
    (1, 32, 8, 8192, 128, True),
    (2, 16, 16, 4096, 128, False),
    (4, 32, 8, 2048, 128, False),
    (1, 28, 4, 16384, 128, True),
    (1, 16, 8, 4096, 256, True),
]
EXTRA = {  # schedules beside the bf16 default, by (D, causal)
    (128, False): [dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8, persistent=True,
                        exp2=True, approx_div=True, v_latency=4, unchecked_loads=True),
                   dict(tile_m=128, tile_n=256, occupancy=1, num_worker_warps=8, exp2=True,
                        approx_div=True, unchecked_loads=True),
                   dict(tile_m=128, tile_n=128, occupancy=2, exp2=True, approx_div=True,
                        k_transposed=True, unchecked_loads=True)],
    (128, True): [dict(tile_m=128, tile_n=128, occupancy=1, num_worker_warps=8, exp2=True,
                       approx_div=True, k_transposed=True, longest_first=True),
                  dict(tile_m=128, tile_n=128, occupancy=2, num_ctas=2, exp2=True,
                       approx_div=True, k_transposed=True, longest_first=True)],
    (256, True): [dict(tile_m=128, tile_n=64, occupancy=1, num_worker_warps=8, exp2=True,
                       k_transposed=True, paired_tiles=True)],
}


def quantise(x, per_head_dim=1):
    """e4m3 values and float32 [B, H] descale factors (amax per (batch, head) over 448)."""
    amax = x.abs().amax(dim=(2, 3)).float().clamp(min=1e-6)
    descale = amax / 448.0
    return (x.float() / descale[:, :, None, None]).to(E4M3), descale


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    sm = device_info(0).sm_count
    rows = []
    for i, (b, hq, hkv, s, d, causal) in enumerate(SHAPES):
        if args.only and str(i) not in args.only.split(","):
            continue
        g = torch.Generator(device="cuda").manual_seed(i)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for h in (hq, hkv, hkv))
        q8, qd = quantise(q)
        k8, kd = quantise(k)
        v8, vd = quantise(v)
        # descale factors per (batch, K/V head): q's per query head folded to its group's max
        qd = qd.view(b, hkv, hq // hkv).amax(-1)
        q8 = (q.float() / qd.repeat_interleave(hq // hkv, 1)[:, :, None, None]).to(E4M3)
        deq = [x.float() * f.repeat_interleave(x.shape[1] // hkv, 1)[:, :, None, None]
               for x, f in ((q8, qd), (k8, kd), (v8, vd))]
        ref = torch.nn.functional.scaled_dot_product_attention(
            *deq, is_causal=causal, enable_gqa=hq != hkv)
        ref16 = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=hq != hkv)
        problem = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                             head_dim=d, dtype="bf16", causal=causal)
        scale = 1 / math.sqrt(d)
        base = default_schedule("sm_90", problem)
        scheds = [("bf16-default", base)] + [(f"x{j}", dataclasses.replace(base, **e))
                                             for j, e in enumerate(EXTRA.get((d, causal), []))]
        fns, outs = {}, {}
        out16 = torch.empty_like(q)
        fns["bf16"] = lambda: ta.sdpa(q, k, v, causal)
        outs["bf16"] = fns["bf16"]()
        stream = torch.cuda.current_stream()
        for sname, sched in scheds:
            sched = L.normalise(problem, sched)
            for vt in (False, True):
                for wide in (False, True):
                    const = dict(L.kernel_constants(problem, sched), FP8=True, V_TRANSPOSED=vt,
                                 PV_WIDE=wide)
                    out = torch.empty_like(q)
                    grid = L.grid_for(problem, sched, sm)
                    kern = L.kernel_for(sched)

                    def run(out=out, const=const, grid=grid, kern=kern, vt=vt):
                        vv = v8.transpose(2, 3).contiguous() if vt else v8
                        rt = dict(Q=q8, K=k8, V=vv, Out=out, qk_scale=scale, heads_q=hq,
                                  group=hq // hkv, QDescale=qd, KDescale=kd, VDescale=vd)
                        _aot.launch(stream, grid, kern, L.ordered_args(rt, const))
                        return out
                    name = f"{sname}|{'Vt' if vt else 'V'}|{'pv16' if wide else 'pv8'}"
                    try:
                        run()
                        torch.cuda.synchronize()
                    except Exception as exc:  # a schedule that does not compile: say so
                        print(name, "FAILED", type(exc).__name__, str(exc)[:200])
                        continue
                    fns[name] = run
                    outs[name] = out
        times = time_interleaved(fns, rounds=args.rounds)
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        t16 = times["bf16"].median_ms
        print(f"\n== B{b} H{hq}/{hkv} S{s} D{d} {'causal' if causal else 'full'}: "
              f"bf16 {t16:.3f} ms {flops / t16 / 1e9:.0f} TFLOP/s, err {rel(outs['bf16'], ref16):.2e}")
        for name, t in times.items():
            if name == "bf16" or isinstance(t, str):
                continue
            err = rel(outs[name], ref)
            print(f"{name:40s} {t.median_ms:8.3f} ms {flops / t.median_ms / 1e9:6.0f} TFLOP/s "
                  f"{t16 / t.median_ms:5.2f}x bf16  err {err:.2e}")
            rows.append((i, name, t16 / t.median_ms, err))
    print("\nshape | best fp8 | x bf16 | err")
    for i in sorted({r[0] for r in rows}):
        best = max((r for r in rows if r[0] == i), key=lambda r: r[2])
        print(f"{SHAPES[i]} | {best[1]} | {best[2]:.2f}x | {best[3]:.2e}")


if __name__ == "__main__":
    main()
